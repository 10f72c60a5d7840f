"""Build a server policy from its config group: `sglang` (native /generate, exact token ids) or `openai` (chat API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.options import from_options

#: keys of the policy config group the launcher reads itself
LAUNCH_KEYS = ("type",)


def make_server_policy(cfg: Mapping[str, Any]):
    from prm.client.retry import RetryPolicy

    kind = cfg.get("type")
    options = {k: v for k, v in cfg.items() if k not in LAUNCH_KEYS}
    if "retry" in options:
        options["retry"] = RetryPolicy.from_config(options["retry"])
    if kind == "sglang":
        from rollout.policy.sglang import SGLangConfig, SGLangPolicy

        return SGLangPolicy(from_options(SGLangConfig, options, "sglang policy"))
    if kind == "openai":
        from rollout.policy.openai import OpenAIConfig, OpenAIPolicy

        return OpenAIPolicy(from_options(OpenAIConfig, options, "openai policy"))
    raise ValueError(f"policy.type={kind!r} is not a server policy; known: sglang, openai")
