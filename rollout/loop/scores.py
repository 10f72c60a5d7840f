"""A scored batch's rewards, advantages and teacher signals written onto the loop's own step records."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rollout.teacher import TeacherBatch
from train.batch import TrajectoryScores
from train.opd import gap_summary, topk_summary
from train.records import Trajectory


def family_teacher(teacher: TeacherBatch, index: Sequence[int]) -> TeacherBatch:
    """The teacher's log-probs of one family's trajectories (`index`: their places in the batch), keyed by their
    places in that family's part."""
    where = {i: j for j, i in enumerate(index)}
    return dataclasses.replace(
        teacher,
        logprobs={(where[i], t): v for (i, t), v in teacher.logprobs.items() if i in where},
        prompt_ids={(where[i], t): v for (i, t), v in teacher.prompt_ids.items() if i in where},
        topk={(where[i], t): v for (i, t), v in teacher.topk.items() if i in where},
    )


def put_scores(trajs: Sequence[Trajectory], scores: TrajectoryScores, teacher: TeacherBatch | None = None) -> None:
    """Write a batch's R_t and A_t onto the loop's own step records (the runner made them for this loop); in the
    directive modes also each step's token advantages, the rule that gave them, the teacher's log-probs and gap, and
    with reward.opd_signal=teacher_topk its distillation weight and the teacher's top-k (what its samples carry)."""
    for i, (tr, rewards, advantages) in enumerate(zip(trajs, scores.rewards, scores.advantages, strict=True)):
        for t, (step, r, a) in enumerate(zip(tr.steps, rewards, advantages, strict=True)):
            step.reward, step.advantage = r, a
            if scores.token_advantages is None or scores.modes is None or scores.gaps is None:
                continue
            step.token_advantages = scores.token_advantages[i][t]
            step.advantage_mode = scores.modes[i][t]
            step.teacher_gap = gap_summary(scores.gaps[i][t])
            if teacher is not None and (i, t) in teacher.logprobs:
                step.teacher_logprobs = teacher.logprobs[(i, t)]
                step.teacher_prompt_ids = teacher.prompt_ids[(i, t)]
            if scores.distill is not None:  # reward.opd_signal=teacher_topk
                step.distill_weight = scores.distill[i][t]
                top = teacher.topk.get((i, t)) if teacher is not None else None
                step.teacher_topk = top if step.distill_weight is not None else None
                step.teacher_topk_summary = (topk_summary(top.token_ids, top.logprobs, step.output_ids)
                                             if top is not None else None)
