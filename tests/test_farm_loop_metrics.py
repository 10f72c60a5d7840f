"""The farm's metrics reach the run's metrics.jsonl and the progress note (RLLoop on a real local farm)."""

from __future__ import annotations

import asyncio

from doubles import ScriptedPolicy
from farm_envs import Books, register_farm_envs
from prm.judge import RuleJudge
from rollout.farm.core import FarmConfig, make_farm
from rollout.policy.base import SamplingParams
from rollout.records import read_jsonl
from train.batch import RewardConfig
from rollout.loop import LoopConfig, RLLoop, RunWriter

register_farm_envs()


class CountingTrainer:
    """Stands in for a trainer backend (not what this test is about): counts updates."""

    def __init__(self) -> None:
        self.version = 0

    def train_step(self, batch):
        self.version += 1
        return {"samples": float(len(batch))}

    def export_weights(self, path: str) -> str:
        return path

    def state_dict(self):
        return {}


def test_farm_metrics_go_to_metrics_jsonl_and_the_progress_note(tmp_path):
    Books.clear()
    notes: list[str] = []

    async def main():
        farm = make_farm("farm_script", {}, FarmConfig(backend="local", num_envs=4))
        await farm.start()
        writer = RunWriter(tmp_path)
        try:
            tasks = [{"id": f"t{i}", "steps": 2, "fail": "step" if i == 0 else None, "fail_first": True} for i in range(3)]
            loop = RLLoop(
                farm=farm, policy=ScriptedPolicy(), judge=RuleJudge(), trainer=CountingTrainer(),
                reward_cfg=RewardConfig(), loop_cfg=LoopConfig(iterations=1, tasks_per_iteration=3, samples_per_task=2,
                                                               eval_tasks=0),
                sampling=SamplingParams(), run_id="r", train_tasks=tasks, eval_tasks=[], writer=writer,
                progress=lambda phase, done, total, note="": notes.append(note),
            )
            return await loop.run()
        finally:
            writer.close()
            await farm.close()

    summary = asyncio.run(main())
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert len(rows) == 1
    row = rows[0]
    for key in ("envs_alive", "in_flight", "steps_per_s", "resets_per_s", "restarts", "aborted_episodes"):
        assert f"farm/{key}" in row
    assert row["farm/aborted_episodes"] == row["episodes_aborted"] >= 1  # task t0 fails once per process
    assert row["farm/steps"] >= 6 and row["farm/restarts"] == 0
    assert summary.farm["farm/aborted_episodes"] == row["farm/aborted_episodes"]
    assert notes and all("st/s" in n and "aborted" in n for n in notes)
