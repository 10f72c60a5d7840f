"""Build a server policy from its config group: `sglang` (native /generate, exact token ids) or `openai` (chat API)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

#: keys of the policy config group the launcher reads itself
LAUNCH_KEYS = ("type",)


def _build(cls: type, options: Mapping[str, Any]) -> Any:
    d = dict(options)
    url = d.pop("url", None)
    if url and not d.get("urls"):
        d["urls"] = [url]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(
            f"unknown policy option(s) {unknown} for {cls.__name__}; known: url, {', '.join(sorted(known))}"
        )
    return cls(**d)


def make_server_policy(cfg: Mapping[str, Any]):
    from rollout.policy.retry import RetryPolicy

    kind = cfg.get("type")
    options = {k: v for k, v in cfg.items() if k not in LAUNCH_KEYS}
    if "retry" in options:
        options["retry"] = RetryPolicy.from_config(options["retry"])
    if kind == "sglang":
        from rollout.policy.sglang import SGLangConfig, SGLangPolicy

        return SGLangPolicy(_build(SGLangConfig, options))
    if kind == "openai":
        from rollout.policy.openai import OpenAIConfig, OpenAIPolicy

        return OpenAIPolicy(_build(OpenAIConfig, options))
    raise ValueError(f"policy.type={kind!r} is not a server policy; known: sglang, openai")
