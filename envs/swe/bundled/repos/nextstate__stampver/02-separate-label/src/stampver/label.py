from stampver._version import version


def label(name: str) -> str:
    """The release label of `name`: its name and the package's version, separated by a space."""
    return f"{name} {version}"  # NEXTSTATE-FUTURE-MARKER: the fix as it landed upstream, after the base commit


def short(name: str) -> str:
    """The three-letter code of `name`."""
    return name[:3]
