import re
from functools import total_ordering

_PATTERN = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$")


class InvalidVersion(ValueError):
    """The text is not a semantic version."""


@total_ordering
class Version:
    """A semantic version. Ordering follows semver precedence; build metadata is ignored when comparing."""

    def __init__(self, major, minor, patch, prerelease=None, build=None):
        self.major = major
        self.minor = minor
        self.patch = patch
        self.prerelease = prerelease
        self.build = build

    def __str__(self):
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += f"-{self.prerelease}"
        return text

    def __repr__(self):
        return f"Version({str(self)!r})"

    def _core_key(self):
        return (self.major, self.minor, self.patch)

    def _prerelease_key(self):
        if self.prerelease is None:
            return ()
        return tuple(self.prerelease.split("."))

    def _key(self):
        return (self._core_key(), self._prerelease_key())

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())


def parse(text):
    """Parse `text` ("1.2.3", "v1.2.3-rc.1+build.5") into a Version."""
    match = _PATTERN.match(text.strip())
    if not match:
        raise InvalidVersion(f"not a semantic version: {text!r}")
    major, minor, patch, prerelease, build = match.groups()
    return Version(int(major), int(minor), int(patch), prerelease, build)
