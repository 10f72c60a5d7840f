"""Pick a Runtime backend by name: `make_runtime("local" | "docker", options)`.

`options` is a plain mapping (what a config file holds): the fields of LocalConfig or DockerConfig, with `limits` as a
mapping of Limits fields. Unknown keys are an error that lists the known ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

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
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(f"unknown {kind} runtime option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if isinstance(opts.get("limits"), Mapping):
        from envs.runtime.local import Limits

        lim_known = {f.name for f in dataclasses.fields(Limits)}
        bad = sorted(set(opts["limits"]) - lim_known)
        if bad:
            raise ValueError(f"unknown runtime limit(s) {', '.join(bad)}; known: {', '.join(sorted(lim_known))}")
        opts = {**opts, "limits": Limits(**opts["limits"])}
    return cls(**opts)
