"""Build a docker image from a recipe, locally: no registry is reachable, so debootstrap Debian and `docker import` it.

One builder for every image recipe (the sandbox's `envs.runtime.images`, the GUI guest's `envs.runtime.guest_image`):
debootstrap the recipe's packages, pip-install its pure-Python wheels into the rootfs, tar it. The tarball is cached on
disk under a name keyed by the recipe, and the image is tagged with the same key, so a second build is a no-op and a
fresh engine (new data root) only re-imports the cached tarball.
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
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootfsRecipe:
    """What goes into an image. Subclasses (the recipes) give every field a default, so `Recipe()` is the image."""

    repository: str  # the image is tagged `{repository}:{suite}-{key}`
    tarball_prefix: str  # the cached rootfs is `{cache_dir}/{tarball_prefix}-{suite}-{key}.tar`
    packages: tuple[str, ...]  # debootstrap --include
    env: dict[str, str]  # ENV of the imported image
    wheels: tuple[str, ...] = ()  # pure-Python wheels, installed by the host's pip into python_site
    python_site: str = "usr/local/lib/python3.11/dist-packages"
    # empty directories made in the rootfs. Not hashed (so the caches built before this module stay valid): a change
    # here must change a hashed field too, or the old tarball is reused
    dirs: tuple[str, ...] = ()
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    variant: str = "minbase"

    @property
    def key(self) -> str:
        # wheels and python_site only enter the hash when there are wheels (python_site means nothing without them);
        # this keeps the keys, hence the tags and cached tarballs, of the recipes as they were before they shared this
        parts: list[object] = [self.suite, self.mirror, sorted(self.packages)]
        if self.wheels:
            parts.append(sorted(self.wheels))
        parts.append(self.variant)
        if self.wheels:
            parts.append(self.python_site)
        parts.append(sorted(self.env.items()))
        return hashlib.sha256(repr(tuple(parts)).encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.suite}-{self.key}"

    def tarball(self, cache_dir: Path) -> Path:
        return cache_dir / f"{self.tarball_prefix}-{self.suite}-{self.key}.tar"


def default_cache_dir() -> Path:
    if "NEXTSTATE_IMAGE_CACHE" in os.environ:
        return Path(os.environ["NEXTSTATE_IMAGE_CACHE"])
    return Path("/var/cache/nextstate/images") if os.geteuid() == 0 else Path.home() / ".cache" / "nextstate" / "images"


def debootstrap_command(recipe: RootfsRecipe, root: Path, debs: Path) -> list[str]:
    return [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.packages)}",
        f"--cache-dir={debs}",
        recipe.suite,
        str(root),
        recipe.mirror,
    ]


def build_rootfs_tarball(recipe: RootfsRecipe, cache_dir: Path) -> Path:
    """debootstrap `recipe` (+ its wheels) into a tarball under `cache_dir`, reused when it exists. Needs root."""
    out = recipe.tarball(cache_dir)
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap not found: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise PermissionError(f"debootstrap needs root to build the {recipe.repository} rootfs")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"nextstate-{recipe.tarball_prefix}-", dir=cache_dir) as tmp:
        root = Path(tmp) / "rootfs"
        debs = cache_dir / "debs"  # downloaded packages survive a failed build and are shared by the recipes
        debs.mkdir(exist_ok=True)
        cmd = debootstrap_command(recipe, root, debs)
        log.info("building the %s rootfs (several minutes): %s", recipe.repository, " ".join(cmd))
        _run(cmd, "debootstrap", root / "debootstrap" / "debootstrap.log")
        if recipe.wheels:
            site = root / recipe.python_site
            site.mkdir(parents=True, exist_ok=True)
            # pure-Python wheels only, so the host's pip can install them for the guest's Python
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
                "pip install into the rootfs",
            )
        # drop package caches: smaller image, same behaviour
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        for d in recipe.dirs:
            (root / d).mkdir(parents=True, exist_ok=True)
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


def ensure_image(client, recipe: RootfsRecipe, cache_dir: Path | None = None) -> str:
    """Return `recipe`'s tag in the engine behind `client` (a docker.DockerClient), building it if missing."""
    import docker

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


def main(recipe: RootfsRecipe, description: str | None, argv: list[str] | None = None) -> int:
    """The CLI of a recipe module: `build` (the image), `rootfs` (only the tarball), `tag` (print the tag)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["build", "rootfs", "tag"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--cache-dir", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
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


__all__ = ["RootfsRecipe", "build_rootfs_tarball", "debootstrap_command", "default_cache_dir", "ensure_image", "main"]
