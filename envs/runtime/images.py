"""Build the docker test image locally: no registry is reachable, so debootstrap a minimal Debian and `docker import` it.

The rootfs tarball is cached on disk (keyed by the recipe), and the image is tagged with the same key, so a second build is a
no-op and a fresh engine (new data root) only re-imports the cached tarball. Used by `.ci/run`, the tests and the benchmark:

    python -m envs.runtime.images build [--docker-host unix:///...] [--cache-dir DIR]
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

REPOSITORY = "nextstate/sandbox"


@dataclass(frozen=True)
class ImageRecipe:
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    # python3 + git: terminal tasks and SWE repos; venv/pip: SWE environments; procps: ps/kill for the agent
    packages: tuple[str, ...] = (
        "python3",
        "python3-venv",
        "python3-pip",
        "git",
        "ca-certificates",
        "procps",
        "xz-utils",
    )
    variant: str = "minbase"
    env: dict[str, str] = field(default_factory=lambda: {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"})

    @property
    def key(self) -> str:
        text = repr((self.suite, self.mirror, sorted(self.packages), self.variant, sorted(self.env.items())))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}:{self.suite}-{self.key}"


def default_cache_dir() -> Path:
    return Path(
        os.environ.get(
            "NEXTSTATE_IMAGE_CACHE",
            "/var/cache/nextstate/images" if os.geteuid() == 0 else Path.home() / ".cache" / "nextstate" / "images",
        )
    )


def build_rootfs_tarball(recipe: ImageRecipe, cache_dir: Path) -> Path:
    """debootstrap `recipe` into a tarball under `cache_dir` (reused when it exists). Needs root and Debian's mirror."""
    out = cache_dir / f"rootfs-{recipe.suite}-{recipe.key}.tar"
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise FileNotFoundError("debootstrap not found: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise PermissionError("debootstrap needs root to build the test image rootfs")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nextstate-rootfs-", dir=cache_dir) as tmp:
        root = Path(tmp) / "rootfs"
        cmd = [
            "debootstrap",
            f"--variant={recipe.variant}",
            f"--include={','.join(recipe.packages)}",
            recipe.suite,
            str(root),
            recipe.mirror,
        ]
        log.info("building the test image rootfs (a few minutes): %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        # drop package caches: smaller image, same behaviour
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        partial = out.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(out)
    return out


def ensure_image(client, recipe: ImageRecipe | None = None, cache_dir: Path | None = None) -> str:
    """Return the tag of the test image in the engine behind `client` (a docker.DockerClient), building it if missing."""
    import docker

    recipe = recipe or ImageRecipe()
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
    p.add_argument("action", choices=["build", "tag"])
    p.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"))
    p.add_argument("--cache-dir", type=Path, default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    recipe = ImageRecipe()
    if args.action == "tag":
        print(recipe.tag)
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
