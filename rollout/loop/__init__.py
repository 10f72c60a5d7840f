"""The rollout <-> train loop (`RLLoop`, in core.py: its schedules, commits and failure handling), in modules of one
job each: its options (config.py), the records it passes and returns (records.py), the run directory's files
(writer.py), which tasks each iteration draws (sampling.py), and the scores written onto its steps (scores.py)."""

from rollout.loop.config import LoopConfig, TrainingFailed
from rollout.loop.core import RLLoop
from rollout.loop.records import (EVAL_FIGURES, FAMILY_FARM_KEYS, EvalResult, ResumePoint, RolloutBatch, RunSummary,
                                  add_advantage_stats, eval_figures, family_summary)
from rollout.loop.sampling import FamilySampler, TaskSampler
from rollout.loop.scores import family_teacher, put_scores
from rollout.loop.writer import RunWriter

__all__ = ["EVAL_FIGURES", "FAMILY_FARM_KEYS", "EvalResult", "FamilySampler", "LoopConfig", "RLLoop", "ResumePoint",
           "RolloutBatch", "RunSummary", "RunWriter", "TaskSampler", "TrainingFailed", "add_advantage_stats",
           "eval_figures", "family_summary", "family_teacher", "put_scores"]
