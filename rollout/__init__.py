"""Drives episodes: the env farm, policies, the episode runner, records, and the launcher."""
