"""The base of every SWE environment image: the sandbox test image (envs.runtime.images) plus what SWE-bench's own base
image carries for building and testing the repositories (a C/C++ toolchain, libffi and libtiff headers, curl, wget, jq),
from Debian's packages. A layer over the test image's cached rootfs (envs.runtime.rootfs_image.LayerRecipe), tagged by
a hash of the recipe: built once, offline of any registry.
"""

from __future__ import annotations

from envs.runtime import rootfs_image
from envs.runtime.images import ImageRecipe
from envs.runtime.rootfs_image import LayerRecipe

#: SWE-bench's base Dockerfile installs these (with python3, git and locales, which the test image has)
SWE_BASE_PACKAGES = ("build-essential", "libffi-dev", "libtiff-dev", "curl", "wget", "jq", "tzdata", "patch")

SWE_BASE = LayerRecipe(base=ImageRecipe(), apt_packages=SWE_BASE_PACKAGES)


def ensure_swe_base_image(client) -> str:
    """The SWE base image's tag in the engine behind `client`, built (once) if missing."""
    return rootfs_image.ensure_image(client, SWE_BASE)  # type: ignore[arg-type]
