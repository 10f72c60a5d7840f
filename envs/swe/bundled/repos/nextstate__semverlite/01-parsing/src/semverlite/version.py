import re

_PATTERN = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+([0-9A-Za-z.-]+))?$")


class InvalidVersion(ValueError):
    """The text is not a semantic version."""


class Version:
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
        if self.build:
            text += f"+{self.build}"
        return text

    def __repr__(self):
        return f"Version({str(self)!r})"


def parse(text):
    """Parse `text` ("1.2.3", "v1.2.3-rc.1+build.5") into a Version."""
    match = _PATTERN.match(text.strip())
    if not match:
        raise InvalidVersion(f"not a semantic version: {text!r}")
    major, minor, patch, prerelease, build = match.groups()
    return Version(major, minor, patch, prerelease, build)
