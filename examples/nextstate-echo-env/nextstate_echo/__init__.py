"""Example NextState plugin env (entry point `echo` in group `nextstate.envs`)."""

from nextstate_echo.env import EchoEnv

__all__ = ["EchoEnv"]
