"""The desktop guest image: a Debian rootfs with Xvfb, AT-SPI, GTK/Tk and pyautogui.

No registry is reachable here, so the image is made from Debian packages (debootstrap `--include`) plus a few pure-Python
wheels (pyautogui and its helpers, gymnasium) installed into the rootfs by the host's pip, by the builder shared with the
sandbox image (`envs.runtime.rootfs_image`). NextState's own code is not baked in: the guest container bind-mounts the
source tree read-only (see `envs.runtime.osworld_docker`), so editing the code never needs a rebuild. The rootfs tarball
is cached on disk and the image is tagged with a hash of the recipe, so a second build is a no-op and a fresh engine
only re-imports the tarball. Used by `.ci/run`, the tests and the benchmark:

    python -m envs.runtime.guest_image build [--docker-host unix:///...] [--cache-dir DIR]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from envs.runtime import rootfs_image
from envs.runtime.rootfs_image import RootfsRecipe

REPOSITORY = "nextstate/desktop-guest"

#: Debian packages of the guest: the X server and window tools, the accessibility stack (dbus-x11 provides the session
#: bus that dconf needs, which debootstrap does not resolve by itself), GTK and Tk for the bundled
#: apps, Flask for the guest API, and what OSWorld's own task configs call (python, sudo, killall, xterm).
GUEST_PACKAGES = (
    "python3",
    "python-is-python3",
    "python3-gi",
    "gir1.2-gtk-3.0",
    "gir1.2-atspi-2.0",
    "at-spi2-core",
    "dbus",
    "dbus-x11",
    "xvfb",
    "xdotool",
    "x11-utils",
    "wmctrl",
    "openbox",
    "xterm",
    "python3-tk",
    "python3-xlib",
    "python3-pil",
    "python3-flask",
    "python3-numpy",
    "python3-cloudpickle",
    "python3-typing-extensions",
    "procps",
    "psmisc",
    "sudo",
    "fonts-dejavu-core",
    "xauth",
)

#: Pure-Python wheels the guest needs that Debian does not package (pinned: the same versions the host tests use).
GUEST_WHEELS = (
    "pyautogui==0.9.54",
    "pymsgbox==2.0.1",
    "pytweening==1.2.0",
    "pyscreeze==1.0.1",
    "pygetwindow==0.0.9",
    "pyrect==0.2.0",
    "mouseinfo==0.1.3",
    "pyperclip==1.11.0",
    "gymnasium==1.4.0",
    "farama-notifications==0.0.4",
)


@dataclass(frozen=True)
class GuestRecipe(RootfsRecipe):
    repository: str = REPOSITORY
    tarball_prefix: str = "desktop-guest"
    packages: tuple[str, ...] = GUEST_PACKAGES
    env: dict[str, str] = field(
        default_factory=lambda: {
            "LANG": "C.UTF-8",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        }
    )
    wheels: tuple[str, ...] = GUEST_WHEELS
    dirs: tuple[str, ...] = ("home/user/Desktop",)  # OSWorld's tasks assume ~user/Desktop


def ensure_image(client, recipe: RootfsRecipe | None = None, cache_dir: Path | None = None) -> str:
    """Return the guest image's tag in the engine behind `client` (a docker.DockerClient), building it if missing."""
    return rootfs_image.ensure_image(client, recipe or GuestRecipe(), cache_dir)


def main(argv: list[str] | None = None) -> int:
    return rootfs_image.main(GuestRecipe(), __doc__, argv)


__all__ = [
    "GUEST_PACKAGES",
    "GUEST_WHEELS",
    "REPOSITORY",
    "GuestRecipe",
    "ensure_image",
]

if __name__ == "__main__":
    sys.exit(main())
