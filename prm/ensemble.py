"""EnsembleJudge: the env's own signals where they are certain, the LLM judge for everything else.

A parse error or a failed command is a sure -1 and an env-confirmed step of progress a sure +1 (the RuleJudge's rules);
only the remaining steps, where the signals say nothing for sure, cost an LLM call. Which signals count as certain is
configurable (`trust`): e.g. for SWE, where a non-zero exit can be expected, trust only parse_error and progress.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.base import ERROR, PARSE_ERROR, PROGRESS
from prm.judge import Judge, Judgement, RuleJudge, StepContext

#: The order in which RuleJudge decides: the first signal present is the one its vote rests on.
RULE_ORDER = (PARSE_ERROR, ERROR, PROGRESS)


class EnsembleJudge(Judge):
    def __init__(self, llm: Judge, *, rule: RuleJudge | None = None, trust: Sequence[str] = RULE_ORDER):
        unknown = sorted(set(trust) - set(RULE_ORDER))
        if unknown:
            raise ValueError(f"ensemble trust {unknown} unknown; choose from {list(RULE_ORDER)}")
        self.llm = llm
        self.rule = rule or RuleJudge()
        self.trust = frozenset(trust)
        self.decided_by_rule = 0
        self.decided_by_llm = 0

    def deciding_signal(self, ctx: StepContext) -> str | None:
        """The signal the rule's vote would rest on, if any."""
        return next((k for k in RULE_ORDER if ctx.signals.get(k)), None)

    async def score(self, ctx: StepContext) -> Judgement:
        key = self.deciding_signal(ctx)
        if key is not None and key in self.trust:
            self.decided_by_rule += 1
            return self.rule.score_now(ctx)
        self.decided_by_llm += 1
        return await self.llm.score(ctx)

    def metrics(self) -> dict[str, int]:
        m = {"judge/decided_by_rule": self.decided_by_rule, "judge/decided_by_llm": self.decided_by_llm}
        return {**m, **self.llm.metrics()}

    async def close(self) -> None:
        await self.llm.close()
