"""The desktop guest rootfs: a Debian with Xvfb, AT-SPI, GTK/Tk and pyautogui, and the starting state of an OSWorld VM.

It is the root of both desktop sandboxes: the docker guest image is imported from it, and the local backend's
sandboxes run over an overlay of it (`envs.runtime.sandbox_root`). OSWorld's tasks assume a disposable Ubuntu VM, so the
rootfs has what they take for granted (a user `user` with password `password` who may `sudo`, a hostname, D-Bus's
machine id, gsettings with GNOME's desktop schemas, Mahjongg installed for the task that removes it, the screen lock off
for the task that turns it on) and, since the sandboxes have no network, an offline apt repository holding the packages
OSWorld's tasks install (zsh, expect) or ask the agent to install (lxml): `apt-get install` really installs them, into
the sandbox's throwaway root, and nothing else resolves.

No registry is reachable here, so the image is made from Debian packages (debootstrap `--include`) plus a few pure-Python
wheels (pyautogui and its helpers, gymnasium) installed into the rootfs by the host's pip, by the builder shared with the
sandbox image (`envs.runtime.rootfs_image`). NextState's own code is not baked in: the guest container bind-mounts the
source tree read-only (see `envs.runtime.osworld_docker`), so editing the code never needs a rebuild. The rootfs tarball
is cached on disk and the image is tagged with a hash of the recipe, so a second build is a no-op and a fresh engine
only re-imports the tarball. Used by `.ci/run`, the tests and the benchmark:

    python -m envs.runtime.guest_image build [--docker-host unix:///...] [--cache-dir DIR]
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envs.runtime import rootfs_image
from envs.runtime.rootfs_image import LayerRecipe, RootfsRecipe, in_root

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
    "passwd",
    "nano",
    "libglib2.0-bin",
    "gsettings-desktop-schemas",
    "dconf-gsettings-backend",
    "dconf-service",
    "gnome-mahjongg",
    "scrot",  # pyautogui.screenshot() (OSWorld's own /screenshot route) shells out to it
)

#: The applications of OSWorld's domains, from Debian (installed by the rootfs's apt-get: their dependency trees are
#: beyond debootstrap's resolver). LibreOffice's GTK 3 plugin gives its windows an AT-SPI tree; VS Code is not in
#: Debian (`env.guest_packages` adds it from a .deb or a vendor apt source: `guest_recipe`).
GUEST_APPS = (
    "libreoffice-calc",
    "libreoffice-writer",
    "libreoffice-impress",
    "libreoffice-gtk3",
    "fonts-liberation2",
    "gimp",
    "vlc",
    "thunderbird",
    "chromium",
    "xdg-utils",
    "librsvg2-common",  # SVG icons (GIMP's toolbox, GTK's symbolic icons)
    "libatk-adaptor",  # GTK 2's AT-SPI bridge and accessibility module: GIMP's accessibility tree
    "libgail-common",
    "socat",  # OSWorld's Chrome tasks forward port 9222 to Chrome's DevTools port with it
)

#: Installable without a network (an apt repository in the rootfs), not installed.
GUEST_OFFLINE_PACKAGES = ("zsh", "expect", "python3-lxml", "jq")  # jq: some Chrome tasks' setups install it

GUEST_USER = "user"  # OSWorld's VM account: uid 1000, password "password", in group sudo
GUEST_PASSWORD = "password"
GUEST_UID = 1000
GUEST_HOSTNAME = "nextstate-desktop"
#: gsettings defaults the OSWorld VM has (Ubuntu's own overrides ship the same way, as a schema override file)
GSETTINGS_OVERRIDE = "[org.gnome.desktop.screensaver]\nlock-enabled=false\n"

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
    offline_packages: tuple[str, ...] = GUEST_OFFLINE_PACKAGES
    apt_packages: tuple[str, ...] = GUEST_APPS
    revision: str = "osworld-user-1"

    def customize(self, root: Path) -> None:
        in_root(root, ["useradd", "-M", "-u", str(GUEST_UID), "-U", "-G", "sudo", "-s", "/bin/bash", GUEST_USER],
                "useradd")
        in_root(root, ["chpasswd"], "chpasswd", stdin=f"{GUEST_USER}:{GUEST_PASSWORD}\n")
        home = root / "home" / GUEST_USER
        for d in ("Desktop", "Documents", "Downloads", "Pictures", "Music", "Videos"):
            (home / d).mkdir(parents=True, exist_ok=True)
        in_root(root, ["cp", "-rT", "/etc/skel", f"/home/{GUEST_USER}"], "home from /etc/skel")
        in_root(root, ["chown", "-R", f"{GUEST_UID}:{GUEST_UID}", f"/home/{GUEST_USER}"], "chown home")
        (root / "etc/hostname").write_text(GUEST_HOSTNAME + "\n")
        (root / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{GUEST_HOSTNAME}\n::1\tlocalhost\n")
        in_root(root, ["dbus-uuidgen", "--ensure=/etc/machine-id"], "machine id")
        (root / "usr/share/glib-2.0/schemas/90_nextstate.gschema.override").write_text(GSETTINGS_OVERRIDE)
        in_root(root, ["glib-compile-schemas", "/usr/share/glib-2.0/schemas"], "glib-compile-schemas")


# a Debian package name (policy 5.6.7), optionally pinned: name=version or name/release
_PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+|/[a-z0-9.-]+)?")
# a one-line apt source: `deb [options] URI suite [components...]`
_APT_SOURCE = re.compile(r"deb\s+(\[[^\]]*\]\s+)?[a-z0-9+]+:\S+\s+\S+(\s+\S+)*")


def guest_recipe(packages: Sequence[str] = (), apt_sources: Sequence[str] = ()) -> GuestRecipe | LayerRecipe:
    """The desktop guest's recipe with `packages` added: each a local .deb file (a path: ends in .deb or holds a /)
    or a package name that Debian's mirror or one of `apt_sources` (apt lines: `deb [trusted=yes] https://... suite
    component`) has. Without packages: the guest's own recipe. With them: a layer over it (its own key, so its own
    cached tarball, image tag and sandbox root; the guest's are untouched). Bad input raises ValueError, one line: a
    .deb that does not exist or is not a Debian package, a malformed name or source line."""
    packages = [str(p).strip() for p in packages]
    apt_sources = [" ".join(str(s).split()) for s in apt_sources]
    if not packages:
        if apt_sources:
            raise ValueError("guest_apt_sources without guest_packages: name the packages to install from them")
        return GuestRecipe()
    debs: list[str] = []
    names: list[str] = []
    for entry in packages:
        if entry.endswith(".deb") or "/" in entry and not _PACKAGE_NAME.fullmatch(entry):
            debs.append(_check_deb(entry))
        elif _PACKAGE_NAME.fullmatch(entry):
            names.append(entry)
        else:
            raise ValueError(f"guest package {entry!r} is neither a Debian package name nor a path to a .deb file")
    for line in apt_sources:
        if not _APT_SOURCE.fullmatch(line):
            raise ValueError(f"guest apt source {line!r} is not an apt line (deb [options] URI suite [component ...])")
    for kind, items in (("package", [*names, *debs]), ("apt source", apt_sources)):
        twice = sorted({x for x in items if items.count(x) > 1})
        if twice:
            raise ValueError(f"guest {kind} listed twice: {', '.join(twice)}")
    return LayerRecipe(GuestRecipe(), apt_packages=tuple(names), local_debs=tuple(debs), apt_sources=tuple(apt_sources))


def _check_deb(entry: str) -> str:
    path = os.path.abspath(os.path.expanduser(entry))
    if not os.path.isfile(path):
        raise ValueError(f"guest package {entry}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(21)
    except OSError as e:
        raise ValueError(f"guest package {entry}: cannot be read ({e.strerror})") from None
    if head != b"!<arch>\ndebian-binary":  # a .deb is an ar archive whose first member is debian-binary
        raise ValueError(f"guest package {entry}: not a Debian package (.deb)")
    return path


def ensure_image(client, recipe: RootfsRecipe | LayerRecipe | None = None, cache_dir: Path | None = None) -> str:
    """Return the guest image's tag in the engine behind `client` (a docker.DockerClient), building it if missing."""
    return rootfs_image.ensure_image(client, recipe or GuestRecipe(), cache_dir)


def main(argv: list[str] | None = None) -> int:
    return rootfs_image.main(GuestRecipe(), __doc__, argv)


__all__ = [
    "GUEST_APPS",
    "GUEST_OFFLINE_PACKAGES",
    "GUEST_PACKAGES",
    "GUEST_WHEELS",
    "REPOSITORY",
    "GuestRecipe",
    "ensure_image",
    "guest_recipe",
]

if __name__ == "__main__":
    sys.exit(main())
