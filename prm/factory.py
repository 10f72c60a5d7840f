"""Build the judge a config names: `judge_config(options)` -> JudgeConfig, `make_judge(config)` -> Judge | None.

`type`: `rule` (default, embedded: the env's signals), `llm` (an OpenAI-compatible judge server), `ensemble` (the signals
where they are certain, the LLM judge elsewhere) or `none` (every step scores 0). `accuracy` < 1 wraps any of them in a
NoisyJudge (each vote wrong with probability 1 - accuracy, seeded by `noise_seed`): experiments on what judge errors
cost. This is the only place the judge type is dispatched (the launcher, its dry run and experiments all come here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from envs.options import check_known, from_options
from prm.ensemble import RULE_ORDER, EnsembleJudge
from prm.hints import MIN_HINT_CHARS, check_hint_steps
from prm.judge import Judge, RuleJudge
from prm.llm_judge import LLMJudge, LLMJudgeConfig
from prm.noisy import NoisyJudge

JUDGE_TYPES = ("rule", "llm", "ensemble", "none")
LLM_TYPES = ("llm", "ensemble")  # the types that take the LLM judge's options (LLMJudgeConfig's fields)


@dataclass
class JudgeConfig:
    """The judge group's keys besides the LLM judge's own options (`llm`, from the same flat mapping)."""

    type: str = "rule"  # rule | llm | ensemble | none
    aggregate: str = "mean"  # votes -> score: mean of valid votes | majority (ties -> 0); the LLM judge's too
    accuracy: float = 1.0  # < 1: each vote is replaced by a wrong one with probability 1 - accuracy (a weaker judge)
    noise_seed: int = 0  # seeds those errors (a pure function of seed, episode, step)
    noise_exact_on_parse_errors: bool = False  # true: malformed actions keep their (-1) vote: errors hit parsed ones
    trust: list[str] = field(default_factory=lambda: list(RULE_ORDER))  # ensemble: the signals taken as certain
    # directive signals (prm/hints.py): also give each step a hint; None: when the reward mode uses them
    # (reward=opd|combined|gated|multiplicative; rollout.build decides)
    hints: bool | None = None
    min_hint_chars: int = MIN_HINT_CHARS  # shorter hints are not kept (the paper's minimum: 10)
    # which steps get hints: wrong (where the next state says how the step should have differed) | directive (those,
    # and right steps whose next state says what to do next: OpenClaw-RL's gate)
    hint_steps: str = "wrong"
    llm: LLMJudgeConfig | None = None  # type llm | ensemble: the judge server and how it is asked

    def __post_init__(self) -> None:
        if self.type not in JUDGE_TYPES:
            raise ValueError(f"unknown judge {self.type!r}: use {', '.join(JUDGE_TYPES)}")
        if self.type in LLM_TYPES and self.llm is None:
            raise ValueError(f"judge type {self.type!r} needs the LLM judge's options (judge.url at least)")
        if self.min_hint_chars < 1:
            raise ValueError(f"judge.min_hint_chars must be >= 1, got {self.min_hint_chars}")
        check_hint_steps(self.hint_steps)


#: JudgeConfig's own keys in a flat judge mapping (`llm` is built from the rest)
OWN_KEYS = tuple(f.name for f in fields(JudgeConfig) if f.name != "llm")
#: the keys that only some judge types take
TYPE_KEYS = {"trust": ("ensemble",)}


def judge_config(options: Mapping[str, Any] | None) -> JudgeConfig:
    """A flat judge mapping (configs/judge/*.yaml, `judge.*` on the command line) as a JudgeConfig: JudgeConfig's own
    keys, and for llm / ensemble every LLMJudgeConfig field (`aggregate` is shared). Unknown keys are an error naming
    the keys this judge type takes."""
    data = dict(options or {})
    kind = data.get("type", "rule")
    if kind in (None, "off"):
        kind = data["type"] = "none"
    if kind not in JUDGE_TYPES:
        raise ValueError(f"unknown judge {kind!r}: use {', '.join(JUDGE_TYPES)}")
    own = [k for k in OWN_KEYS if kind in TYPE_KEYS.get(k, (kind,))]
    if kind not in LLM_TYPES:
        check_known(own, data, f"{kind} judge")
        return from_options(JudgeConfig, data, f"{kind} judge")
    llm_keys = [f.name for f in fields(LLMJudgeConfig)]
    check_known({*own, *llm_keys}, data, "LLM judge")
    llm_options = {k: v for k, v in data.items() if k in llm_keys}
    return from_options(JudgeConfig, {k: v for k, v in data.items() if k in own}, "judge",
                        llm=from_options(LLMJudgeConfig, llm_options, "LLM judge"))


def make_judge(cfg: JudgeConfig | Mapping[str, Any] | None) -> Judge | None:
    """The judge `cfg` describes (a JudgeConfig, or a flat mapping for `judge_config`); None for type none."""
    if not isinstance(cfg, JudgeConfig):
        cfg = judge_config(cfg)
    if cfg.type == "none":
        return None
    hints = {"hints": bool(cfg.hints), "min_hint_chars": cfg.min_hint_chars, "hint_steps": cfg.hint_steps}
    rule = RuleJudge(aggregate_mode=cfg.aggregate, **hints)
    judge: Judge = rule if cfg.type == "rule" else LLMJudge(cfg.llm, **hints)
    if cfg.type == "ensemble":
        judge = EnsembleJudge(judge, rule=rule, trust=tuple(cfg.trust))
    if cfg.accuracy < 1.0:
        judge = NoisyJudge(judge, cfg.accuracy, seed=cfg.noise_seed, aggregate_mode=cfg.aggregate,
                           exact_on_parse_errors=cfg.noise_exact_on_parse_errors)
    return judge


__all__ = ["JUDGE_TYPES", "JudgeConfig", "judge_config", "make_judge"]
