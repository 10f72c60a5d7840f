"""Turns trajectories into policy updates: reward math, the loss, trainer backends and the rollout-train loop."""
