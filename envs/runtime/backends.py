"""Pick a Runtime backend by name: `make_runtime("local" | "docker", options)`.

`options` is a plain mapping (what a config file holds): the fields of LocalConfig or DockerConfig, with `limits` as a
mapping of Limits fields. Unknown keys are an error that lists the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.options import from_options

BACKENDS = ("local", "docker")


def make_runtime(kind: str, options: Mapping[str, Any] | None = None, **overrides: Any):
    opts = {**dict(options or {}), **overrides}
    if kind == "local":
        from envs.runtime.local import LocalConfig, LocalRuntime

        return LocalRuntime(_build(LocalConfig, opts, kind))
    if kind == "docker":
        from envs.runtime.docker import DockerConfig, DockerRuntime

        return DockerRuntime(_build(DockerConfig, opts, kind))
    raise ValueError(f"runtime {kind!r} is not a backend; use one of {', '.join(BACKENDS)}")


def _build(cls, opts: dict[str, Any], kind: str):
    return from_options(cls, opts, f"{kind} runtime")  # `limits` as a mapping of Limits fields
