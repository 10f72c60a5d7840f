"""Judge observability from the step records alone: how the votes agree, how often they are invalid, what the verdicts
cost (latency, tokens), and how they agree with what the env knows for sure. The same numbers go to metrics.jsonl
(`judge/*` keys of train rows, and of eval rows when evaluation is judged), the progress line and the viewer.

- `judge/unanimous_fraction`: of the steps with at least two valid votes, the fraction whose valid votes all agree
  (also per family: `judge/<family>/unanimous_fraction`); null when no step had two valid votes (e.g. m = 1).
- `judge/invalid_vote_rate`: votes without a valid `\\boxed{}` (failed requests included) over all votes.
- `judge/latency_p50_s`, `judge/latency_p95_s`: wall seconds from a step's score() call to its verdict (queueing for a
  request slot included), over the steps that were not answered from the judge's cache.
- `judge/prompt_tokens`, `judge/completion_tokens`: as the judge server reported them (`usage`), summed.
- `judge/verifiable_agreement`: over the steps where the env's signals settle the verdict (a parse error, a failed
  command or tool call, a wrong value: -1; a milestone reached or tests passing: +1; the first that applies, in the
  RuleJudge's order), the fraction the judge scored with the same sign (a 0 score agrees with neither);
  `judge/agreement/<signal>` per signal. A RuleJudge agrees by construction; an LLM judge shows here how often it
  contradicts the env.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envs.base import ERROR, PARSE_ERROR, PROGRESS, WRONG
from prm.judge import Judgement
from train.records import Trajectory

#: the signals that settle a step's verdict, in the order the RuleJudge reads them, with the sign they call for
VERIFIABLE: tuple[tuple[str, int], ...] = ((PARSE_ERROR, -1), (ERROR, -1), (WRONG, -1), (PROGRESS, 1))


def verifiable_verdict(signals: Mapping[str, Any]) -> tuple[str, int] | None:
    """(the signal that settles the step, the sign it calls for), or None when the env knows nothing for sure."""
    for key, sign in VERIFIABLE:
        if signals.get(key):
            return key, sign
    return None


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


@dataclass
class JudgeTally:
    """Judged steps, accumulated (`add`), as metrics (`as_metrics`) or one short line (`brief`)."""

    steps: int = 0
    votes: int = 0
    invalid_votes: int = 0
    cached_steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    multi_vote: Counter = field(default_factory=Counter)  # family -> steps with >= 2 valid votes
    unanimous: Counter = field(default_factory=Counter)  # family -> of those, steps whose valid votes all agree
    family_votes: Counter = field(default_factory=Counter)
    family_invalid: Counter = field(default_factory=Counter)
    verifiable: Counter = field(default_factory=Counter)  # signal -> steps it settles
    agree: Counter = field(default_factory=Counter)  # signal -> of those, steps the judge scored with its sign

    def add(self, judgement: Judgement, signals: Mapping[str, Any], family: str) -> None:
        self.steps += 1
        votes = list(judgement.votes)
        valid = [v for v in votes if v is not None]
        self.votes += len(votes)
        self.invalid_votes += len(votes) - len(valid)
        self.family_votes[family] += len(votes)
        self.family_invalid[family] += len(votes) - len(valid)
        if len(valid) >= 2:
            self.multi_vote[family] += 1
            self.unanimous[family] += len(set(valid)) == 1
        if judgement.cached:
            self.cached_steps += 1
        else:
            self.latencies.append(float(judgement.latency_s))
        self.prompt_tokens += int(judgement.prompt_tokens)
        self.completion_tokens += int(judgement.completion_tokens)
        settled = verifiable_verdict(signals)
        if settled is not None:
            key, sign = settled
            self.verifiable[key] += 1
            self.agree[key] += judgement.score * sign > 0

    def add_trajectories(self, trajs: Iterable[Trajectory]) -> JudgeTally:
        for traj in trajs:
            for step in traj.steps:
                if step.judge is not None:
                    self.add(step.judge, step.signals, traj.family or "generic")
        return self

    def latency(self, q: float) -> float | None:
        return float(np.percentile(self.latencies, q)) if self.latencies else None

    def as_metrics(self) -> dict[str, Any]:
        """`judge/*` keys (see the module doc); {} when no step was judged."""
        if not self.steps:
            return {}
        multi, unan = sum(self.multi_vote.values()), sum(self.unanimous.values())
        ver, agr = sum(self.verifiable.values()), sum(self.agree.values())
        out: dict[str, Any] = {
            "judge/steps": self.steps,
            "judge/votes": self.votes,
            "judge/invalid_vote_rate": _rate(self.invalid_votes, self.votes),
            "judge/multi_vote_steps": multi,
            "judge/unanimous_fraction": _rate(unan, multi),
            "judge/cached_steps": self.cached_steps,
            "judge/latency_p50_s": self.latency(50),
            "judge/latency_p95_s": self.latency(95),
            "judge/prompt_tokens": self.prompt_tokens,
            "judge/completion_tokens": self.completion_tokens,
            "judge/verifiable_steps": ver,
            "judge/verifiable_agreement": _rate(agr, ver),
        }
        for key, _ in VERIFIABLE:
            if self.verifiable[key]:
                out[f"judge/agreement/{key}"] = _rate(self.agree[key], self.verifiable[key])
        for fam in sorted(self.family_votes):
            out[f"judge/{fam}/unanimous_fraction"] = _rate(self.unanimous[fam], self.multi_vote[fam])
            out[f"judge/{fam}/invalid_vote_rate"] = _rate(self.family_invalid[fam], self.family_votes[fam])
        return out

    def brief(self) -> str:
        """For the progress line: `judge unanimous 83% invalid 2% p50 0.41s p95 1.20s tokens 12k/3k env-agree 95%`."""
        if not self.steps:
            return ""
        m = self.as_metrics()
        parts = ["judge"]
        if m["judge/unanimous_fraction"] is not None:
            parts.append(f"unanimous {m['judge/unanimous_fraction']:.0%}")
        parts.append(f"invalid {m['judge/invalid_vote_rate']:.0%}")
        if self.prompt_tokens or self.completion_tokens:  # an LLM judge: what it costs
            parts.append(f"p50 {m['judge/latency_p50_s']:.2f}s p95 {m['judge/latency_p95_s']:.2f}s"
                         if self.latencies else "all cached")
            parts.append(f"tokens {_k(self.prompt_tokens)}/{_k(self.completion_tokens)}")
        if m["judge/verifiable_agreement"] is not None:
            parts.append(f"env-agree {m['judge/verifiable_agreement']:.0%}")
        return " ".join(parts)


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


__all__ = ["VERIFIABLE", "JudgeTally", "verifiable_verdict"]
