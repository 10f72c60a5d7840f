"""Drives episodes: the env farm, policies and their clients, the episode runner, the rollout <-> train loop, the
launcher, experiments and reports (the top layer: it may import envs, prm and train)."""
