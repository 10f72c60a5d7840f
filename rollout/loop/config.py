"""The loop's options (`loop.*`) and the error it stops with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollout.episodes.gc_pacing import DEFAULT_THRESHOLD0
from rollout.mix import DEFAULT_STALENESS
from rollout.weight_sync import MODES
from train.sample_layout import LAYOUTS


@dataclass
class LoopConfig:
    iterations: int = 4
    tasks_per_iteration: int = 8  # B task groups per iteration
    samples_per_task: int = 4  # n samples per task (the normalization group)
    eval_tasks: int = 64  # held-out tasks evaluated before and after training (0: no eval)
    eval_every: int = 0  # also evaluate every k iterations (0: only before and after)
    # env=mix: also evaluate the families of weight 0 (warm-started on, never trained on); false: only the trained
    # families (an untrained family's envs then never start)
    eval_untrained: bool = True
    eval_judge: bool = False  # judge evaluation episodes too (off: evaluation never costs judge calls)
    eval_samples: int = 1  # episodes per held-out task (accuracy = mean over all of them, e.g. AIME avg@16)
    eval_greedy: bool = True  # greedy evaluation; false: the rollout sampling settings (with eval_samples > 1)
    max_retries: int = 2  # re-run a task whose episode aborted (env failure) up to this many times
    seed: int = 0
    record_token_ids: bool = False  # also write prompt/output token ids and logprobs to trajectories.jsonl
    # 0: synchronous (on-policy); S >= 1: rollouts run ahead of training by up to S versions; or a map family -> S
    # (env=mix: e.g. {toolcall: 2, gui: 0}; a family it does not name gets rollout.mix.DEFAULT_STALENESS)
    max_staleness: int | dict[str, int] = DEFAULT_STALENESS
    sample_layout: str = "step"  # "step": one sample per step; "trajectory": one per episode with per-step spans
    weight_sync: str = "auto"  # "auto" | "memory" (in-process state dict) | "disk" (export, policy loads the path)
    weights_dir: str | None = None  # disk sync: versioned exports go here; None: <run dir>/weights
    keep_weight_versions: int = 2  # disk sync: exports kept
    max_sync_failures: int = 3  # consecutive failed weight syncs tolerated (the policy keeps older weights meanwhile)
    save_screenshots: bool = True  # GUI: each step's screen as a PNG under <run>/screenshots/ (envs without images: none)
    # each step's policy and judge requests split into phases (connection wait, server, read) in its `timing`
    # (trajectories.jsonl; prm/client/timing.py): where a step's wall time goes, at a few microseconds per request
    trace_requests: bool = False
    # Python's generation-0 GC threshold while episodes run (rollout/episodes/gc_pacing.py: a third less CPU per step
    # at hundreds of episodes in flight); 0: the interpreter's own (700)
    gc_threshold: int = DEFAULT_THRESHOLD0
    # episodes run in this many Ray actors, each with its own event loop, share of the env slots, policy and judge
    # clients (rollout/episodes/pool.py; needs a server policy); 1: in this process
    runners: int = 1
    # every iteration: the trainer's log-probs of the sampled tokens (one forward before the update) against the
    # rollout's, as logprobs/* metrics (max and mean |delta|, the importance ratio's range and spread), on the samples
    # of the trainer's current weights
    logprob_mismatch: bool = True

    def __post_init__(self) -> None:
        bounds = self.max_staleness.values() if isinstance(self.max_staleness, Mapping) else [self.max_staleness]
        if any(not isinstance(b, int) or isinstance(b, bool) or b < 0 for b in bounds):
            raise ValueError(f"loop.max_staleness must be >= 0 (0 = synchronous): an integer, or a map family -> "
                             f"integer, got {self.max_staleness}")
        if self.sample_layout not in LAYOUTS:
            raise ValueError(f"loop.sample_layout={self.sample_layout!r}: use one of {', '.join(LAYOUTS)}")
        if self.weight_sync not in MODES:
            raise ValueError(f"loop.weight_sync={self.weight_sync!r}: use one of {', '.join(MODES)}")
        if not isinstance(self.gc_threshold, int) or isinstance(self.gc_threshold, bool) or self.gc_threshold < 0:
            raise ValueError(f"loop.gc_threshold must be an integer >= 0 (0: Python's own), got {self.gc_threshold!r}")
        if not isinstance(self.runners, int) or isinstance(self.runners, bool) or self.runners < 1:
            raise ValueError(f"loop.runners must be an integer >= 1 (1: episodes run in this process), got {self.runners}")


class TrainingFailed(RuntimeError):
    """The trainer (or the weight sync) failed; the loop stopped after checkpointing what it could."""

    def __init__(self, stage: str, iteration: int, version: int, cause: BaseException, checkpoint: str | None):
        self.stage, self.iteration, self.version, self.checkpoint = stage, iteration, version, checkpoint
        where = f"checkpoint: {checkpoint}" if checkpoint else "no checkpoint could be written"
        super().__init__(
            f"{stage} failed at iteration {iteration} (trainer at weight version {version}): "
            f"{type(cause).__name__}: {cause}; {where}"
        )
