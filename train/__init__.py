"""Turns trajectories into policy updates: reward math, the loss, trainer backends, SFT and the tiny model builders.

It imports nothing from `rollout` (docs/architecture.md, "Layers"): the rollout <-> train loop lives in rollout.loop.
"""
