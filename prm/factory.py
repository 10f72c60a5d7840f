"""Build the judge a config names (`type`): `rule` (default, embedded), `llm`, `ensemble`, or `none`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prm.judge import Judge, RuleJudge

#: keys of the judge config group that are not judge options (the launcher reads them)
LAUNCH_KEYS = ("type", "name", "in_eval", "trust")


def make_judge(cfg: Mapping[str, Any] | None) -> Judge | None:
    cfg = dict(cfg or {})
    name = cfg.get("type", cfg.get("name", "rule"))
    if name in (None, "none", "off"):
        return None
    options = {k: v for k, v in cfg.items() if k not in LAUNCH_KEYS}
    if name == "rule":
        return RuleJudge(aggregate_mode=options.get("aggregate", "mean"))
    if name in ("llm", "ensemble"):
        from prm.llm_judge import LLMJudge, LLMJudgeConfig

        llm = LLMJudge(LLMJudgeConfig.from_mapping(options))
        if name == "llm":
            return llm
        from prm.ensemble import RULE_ORDER, EnsembleJudge

        return EnsembleJudge(llm, trust=tuple(cfg.get("trust") or RULE_ORDER))
    raise ValueError(f"unknown judge {name!r}: use rule, llm, ensemble or none")
