"""Build the desktop guest image locally: a Debian rootfs with Xvfb, AT-SPI, GTK/Tk and pyautogui, `docker import`ed.

No registry is reachable here, so the image is made from Debian packages (debootstrap `--include`) plus a few pure-Python
wheels (pyautogui and its helpers, gymnasium) installed into the rootfs by the host's pip. NextState's own code is not
baked in: the guest container bind-mounts the source tree read-only (see `envs.runtime.osworld_docker`), so editing the
code never needs a rebuild. The rootfs tarball is cached on disk and the image is tagged with a hash of the recipe, so a
second build is a no-op and a fresh engine only re-imports the tarball. Used by `.ci/run`, the tests and the benchmark:

    python -m envs.runtime.guest_image build [--docker-host unix:///...] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

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
class GuestRecipe:
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: tuple[str, ...] = GUEST_PACKAGES
    wheels: tuple[str, ...] = GUEST_WHEELS
    variant: str = "minbase"
    python_site: str = "usr/local/lib/python3.11/dist-packages"
    env: dict[str, str] = field(
        default_factory=lambda: {
            "LANG": "C.UTF-8",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        }
    )

    @property
    def key(self) -> str:
        text = repr(
            (
                self.suite,
                self.mirror,
                sorted(self.packages),
                sorted(self.wheels),
                self.variant,
                self.python_site,
                sorted(self.env.items()),
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}:{self.suite}-{self.key}"


def default_cache_dir() -> Path:
    if "NEXTSTATE_IMAGE_CACHE" in os.environ:
        return Path(os.environ["NEXTSTATE_IMAGE_CACHE"])
    return Path("/var/cache/nextstate/images") if os.geteuid() == 0 else Path.home() / ".cache" / "nextstate" / "images"


def build_rootfs_tarball(recipe: GuestRecipe, cache_dir: Path) -> Path:
    """debootstrap `recipe` (+ its wheels) into a tarball under `cache_dir`, reused when it exists. Needs root."""
    out = cache_dir / f"desktop-guest-{recipe.suite}-{recipe.key}.tar"
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap not found: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise PermissionError("debootstrap needs root to build the desktop guest rootfs")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nextstate-guest-", dir=cache_dir) as tmp:
        root = Path(tmp) / "rootfs"
        debs = cache_dir / "debs"  # downloaded packages survive a failed build
        debs.mkdir(exist_ok=True)
        cmd = [
            "debootstrap",
            f"--variant={recipe.variant}",
            f"--include={','.join(recipe.packages)}",
            f"--cache-dir={debs}",
            recipe.suite,
            str(root),
            recipe.mirror,
        ]
        log.info("building the desktop guest rootfs (several minutes): %s", " ".join(cmd))
        _run(cmd, "debootstrap", root / "debootstrap" / "debootstrap.log")
        site = root / recipe.python_site
        site.mkdir(parents=True, exist_ok=True)
        # pure-Python wheels only, so the host's pip can install them for the guest's Python 3.11
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-compile",
                "--target",
                str(site),
                *recipe.wheels,
            ],
            "pip install into the guest rootfs",
        )
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        (root / "home" / "user" / "Desktop").mkdir(parents=True, exist_ok=True)  # OSWorld's tasks assume ~user/Desktop
        partial = out.with_suffix(".tar.partial")
        _run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], "tar")
        partial.rename(out)
    return out


def _run(cmd: list[str], what: str, log_file: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = log_file.read_text(errors="replace")[-3000:] if log_file is not None and log_file.exists() else ""
        raise RuntimeError(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{detail}"
        )


def ensure_image(client, recipe: GuestRecipe | None = None, cache_dir: Path | None = None) -> str:
    """Return the guest image's tag in the engine behind `client` (a docker.DockerClient), building it if missing."""
    import docker

    recipe = recipe or GuestRecipe()
    try:
        client.images.get(recipe.tag)
        return recipe.tag
    except docker.errors.ImageNotFound:
        pass
    tarball = build_rootfs_tarball(recipe, cache_dir or default_cache_dir())
    changes = [f"ENV {k}={v}" for k, v in recipe.env.items()] + ['CMD ["/bin/bash"]']
    repo, tag = recipe.tag.split(":")
    client.api.import_image_from_file(str(tarball), repository=repo, tag=tag, changes=changes)
    client.images.get(recipe.tag)  # raises if the import did not produce it
    log.info("imported %s from %s", recipe.tag, tarball)
    return recipe.tag


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "rootfs", "tag"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--cache-dir", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    recipe = GuestRecipe()
    if args.action == "tag":
        print(recipe.tag)
        return 0
    if args.action == "rootfs":
        print(build_rootfs_tarball(recipe, args.cache_dir or default_cache_dir()))
        return 0
    import docker

    client = docker.DockerClient(base_url=args.docker_host) if args.docker_host else docker.from_env()
    try:
        print(ensure_image(client, recipe, args.cache_dir))
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
