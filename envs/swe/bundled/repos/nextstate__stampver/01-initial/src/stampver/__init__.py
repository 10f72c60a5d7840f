from stampver._version import version as __version__
from stampver.label import label, short

__all__ = ["__version__", "label", "short"]
