from stampver._version import version


def label(name: str) -> str:
    """The release label of `name`: its name and the package's version."""
    return name + version


def short(name: str) -> str:
    """The three-letter code of `name`."""
    return name[:3]
