"""Rollout-vs-trainer log-prob agreement: the parity check after every weight sync, and the mismatch metrics of every
iteration.

- **Parity check** (`check_parity`): each policy server continues one fixed probe context (a chat prompt rendered by
  the policy's own template) for `probe_tokens` tokens at the sampling temperature with a fixed seed; the trainer
  scores the same tokens under the same context; the largest |server - trainer| log-prob is the server's
  difference. Above `tolerance` the sync did not give the server the trainer's weights (a stale or half-applied
  reload, a stale prefix cache, another model) and the run stops (`on_mismatch=error`: WeightParityError, naming the
  server, the version and the difference) or says so (`warn`). The probe goes through generation, the rollouts' own
  path (decode with the KV cache; the probe context sits in the prefix cache from the previous check, so a cache the
  sync failed to reset shows), not through prompt scoring.
- **Mismatch metrics** (`mismatch_metrics`): on the sampled tokens of a training batch, the rollout's log-probs
  against the trainer's recomputation before the update: max and mean |delta|, and the importance ratio
  exp(trainer - rollout)'s range and spread.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from rollout.policy.base import SamplingParams
from train.records import TrainSample

log = logging.getLogger(__name__)

ON_MISMATCH = ("error", "warn")
#: the probe's prompt: one user turn, rendered by the policy's chat template (so the check covers its ids too)
PROBE_MESSAGES = ({"role": "user", "content": "Parity probe: add 12 and 30, then list three prime numbers."},)
PROBE_SEED = 20261206  # the probe's sampling seed: the same tokens on every check of an unchanged server


@dataclass
class ParityConfig:
    """`policy.parity.*` of the token-exact server policies (sglang, vllm)."""

    enabled: bool = True
    # max |server - trainer| log-prob on the probe: float32 on both sides agrees to ~1e-6; a bfloat16 server against a
    # float32 trainer needs ~5e-2 (docs/policies.md, "Weight sync")
    tolerance: float = 1e-4
    on_mismatch: str = "error"  # error: the run stops with WeightParityError | warn: logged and recorded, the run goes on
    probe_tokens: int = 32  # tokens each server generates from the probe context (EOS ignored)

    def __post_init__(self) -> None:
        if self.on_mismatch not in ON_MISMATCH:
            raise ValueError(f"policy.parity.on_mismatch={self.on_mismatch!r}: use one of {', '.join(ON_MISMATCH)}")
        if not self.tolerance > 0:
            raise ValueError(f"policy.parity.tolerance must be > 0, got {self.tolerance}")
        if self.probe_tokens < 1:
            raise ValueError(f"policy.parity.probe_tokens must be >= 1, got {self.probe_tokens}")


@dataclass
class ParityResult:
    version: int
    differences: dict[str, float]  # server URL -> max |server - trainer| log-prob over its probe tokens
    tokens: dict[str, int]  # server URL -> probe tokens compared
    tolerance: float
    seconds: float
    failed: dict[str, float] = field(default_factory=dict)  # the servers above the tolerance

    @property
    def max_difference(self) -> float:
        return max(self.differences.values(), default=0.0)

    def metrics(self) -> dict[str, float]:
        return {"weight_sync/parity_max_diff": self.max_difference, "weight_sync/parity_s": self.seconds,
                "weight_sync/parity_failed_servers": float(len(self.failed))}


class WeightParityError(RuntimeError):
    """A server's log-probs differ from the trainer's after a weight sync (on_mismatch=error): the run stops."""

    def __init__(self, result: ParityResult):
        self.result = result
        url, diff = max(result.failed.items(), key=lambda kv: kv[1])
        others = f" ({len(result.failed) - 1} more server(s) above it too)" if len(result.failed) > 1 else ""
        super().__init__(
            f"log-prob parity failed after the weight sync of v{result.version}: server {url} differs from the "
            f"trainer by {diff:.3g} (max |delta log p| over {result.tokens[url]} probe tokens; tolerance "
            f"{result.tolerance:g}){others}: it does not serve the trainer's weights")


def probe_context(policy: Any) -> list[int]:
    """The fixed probe context: the probe messages as the policy renders them (its template and generation prompt)."""
    return list(policy.prompt_ids(list(PROBE_MESSAGES)))


async def check_parity(policy: Any, trainer: Any, version: int, cfg: ParityConfig, temperature: float,
                       trainer_lock: AbstractAsyncContextManager | None = None) -> ParityResult:
    """Every server's probe log-probs against the trainer's; raises WeightParityError above the tolerance
    (on_mismatch=error), RuntimeError when a server gave no probe answer (the sync failed)."""
    t0 = time.perf_counter()
    context = probe_context(policy)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=cfg.probe_tokens, seed=PROBE_SEED)
    answers = await policy.probe_servers(context, sampling)
    broken = {url: a for url, a in answers.items() if isinstance(a, BaseException) or not a[0]}
    if broken:
        raise RuntimeError(f"the parity probe after the weight sync of v{version} got no tokens from "
                           + "; ".join(f"{u}: {a}" for u, a in broken.items()))
    urls = list(answers)
    sequences = [(context, list(answers[u][0])) for u in urls]
    async with trainer_lock or nullcontext():
        reference = await asyncio.to_thread(trainer.action_logprobs, sequences)
    diffs, tokens = {}, {}
    for url, ref in zip(urls, reference):
        served = answers[url][1]
        diffs[url] = max(abs(a - b) for a, b in zip(served, ref))
        tokens[url] = len(served)
    result = ParityResult(version, diffs, tokens, cfg.tolerance, time.perf_counter() - t0,
                          failed={u: d for u, d in diffs.items() if not d <= cfg.tolerance})  # NaN fails too
    if result.failed:
        error = WeightParityError(result)
        if cfg.on_mismatch == "error":
            raise error
        log.warning("%s (policy.parity.on_mismatch=warn: the run goes on)", error)
    else:
        log.info("log-prob parity after v%d: max |delta| %.2g over %d server(s) (tolerance %g)", version,
                 result.max_difference, len(diffs), cfg.tolerance)
    return result


def mismatch_metrics(samples: Sequence[TrainSample], trainer_logprobs: Sequence[Sequence[float]]) -> dict[str, float]:
    """The rollout's log-probs against the trainer's on every loss token (the sampled tokens that train): max and
    mean |delta|, and the importance ratio exp(trainer - rollout): its min, max and standard deviation."""
    deltas: list[float] = []
    for s, lp in zip(samples, trainer_logprobs, strict=True):
        deltas += [b - a for m, a, b in zip(s.loss_mask[1:], s.rollout_logprobs[1:], lp[1:]) if m]
    if not deltas:
        return {}
    ratios = [math.exp(max(min(d, 50.0), -50.0)) for d in deltas]
    mean_ratio = sum(ratios) / len(ratios)
    return {
        "logprobs/mismatch_max": max(abs(d) for d in deltas),
        "logprobs/mismatch_mean": sum(abs(d) for d in deltas) / len(deltas),
        "logprobs/ratio_min": min(ratios),
        "logprobs/ratio_max": max(ratios),
        "logprobs/ratio_std": math.sqrt(sum((r - mean_ratio) ** 2 for r in ratios) / len(ratios)),
        "logprobs/tokens": float(len(deltas)),
    }


__all__ = ["ON_MISMATCH", "ParityConfig", "ParityResult", "WeightParityError", "check_parity", "mismatch_metrics",
           "probe_context"]
