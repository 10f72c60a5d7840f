"""semverlite: parse and compare semantic versions (https://semver.org)."""

from semverlite.version import InvalidVersion, Version, parse

__all__ = ["InvalidVersion", "Version", "parse"]
