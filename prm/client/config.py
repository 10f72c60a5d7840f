"""Config dataclasses of clients of model servers (the LLM judge, the sglang / openai policies) from a mapping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def server_client_config(cls: type, options: Mapping[str, Any], what: str, owner: str | None = None) -> Any:
    """Build the config dataclass `cls` of a client of model servers (a policy, the LLM judge) from a mapping: `url` is
    shorthand for `urls=[url]`; unknown keys are an error that names the known ones (`what` and `owner` name the
    client in it)."""
    d = dict(options)
    url = d.pop("url", None)
    if url and not d.get("urls"):
        d["urls"] = [url]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        where = f" for {owner}" if owner else ""
        raise ValueError(f"unknown {what} option(s) {unknown}{where}; known: url, {', '.join(sorted(known))}")
    return cls(**d)
