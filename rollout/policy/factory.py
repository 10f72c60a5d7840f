"""Build a server policy from its config group: `sglang` (native /generate, exact token ids) or `openai` (chat API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prm.client.config import server_client_config

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

        return SGLangPolicy(server_client_config(SGLangConfig, options, "policy", owner="SGLangConfig"))
    if kind == "openai":
        from rollout.policy.openai import OpenAIConfig, OpenAIPolicy

        return OpenAIPolicy(server_client_config(OpenAIConfig, options, "policy", owner="OpenAIConfig"))
    raise ValueError(f"policy.type={kind!r} is not a server policy; known: sglang, openai")
