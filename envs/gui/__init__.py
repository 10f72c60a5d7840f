"""The gui family: OSWorld-style desktop tasks on local Xvfb desktops, in a docker guest, or on an OSWorld VM."""

from envs.gui.env import GUIConfig, GUIEnv

__all__ = ["GUIConfig", "GUIEnv"]
