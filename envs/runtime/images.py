"""The sandbox test image (terminal commands, SWE environments): a minimal Debian with python3 and git.

No registry is reachable, so it is built locally by `envs.runtime.rootfs_image` (debootstrap + `docker import`, the
rootfs tarball cached on disk and the image tagged by a hash of the recipe, so a second build is a no-op and a fresh
engine only re-imports the tarball). Used by `.ci/run`, the tests and the benchmark:

    python -m envs.runtime.images build [--docker-host unix:///...] [--cache-dir DIR]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from envs.runtime import rootfs_image
from envs.runtime.rootfs_image import RootfsRecipe

REPOSITORY = "nextstate/sandbox"

#: python3 + git: terminal tasks and SWE repos; venv/pip: SWE environments; procps: ps/kill for the agent
SANDBOX_PACKAGES = ("python3", "python3-venv", "python3-pip", "git", "ca-certificates", "procps", "xz-utils")


@dataclass(frozen=True)
class ImageRecipe(RootfsRecipe):
    repository: str = REPOSITORY
    tarball_prefix: str = "rootfs"
    packages: tuple[str, ...] = SANDBOX_PACKAGES
    env: dict[str, str] = field(default_factory=lambda: {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"})


def ensure_image(client, recipe: RootfsRecipe | None = None, cache_dir: Path | None = None) -> str:
    """Return the tag of the test image in the engine behind `client` (a docker.DockerClient), building it if missing."""
    return rootfs_image.ensure_image(client, recipe or ImageRecipe(), cache_dir)


def main(argv: list[str] | None = None) -> int:
    return rootfs_image.main(ImageRecipe(), __doc__, argv)


__all__ = ["REPOSITORY", "SANDBOX_PACKAGES", "ImageRecipe", "ensure_image"]

if __name__ == "__main__":
    sys.exit(main())
