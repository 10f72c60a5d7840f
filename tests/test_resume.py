"""Resume, piece by piece: which records a run state covers and how the rest is set aside (a torn last line, a resume
that is itself killed), the config a resumed run takes, the run state file, the task sampler's replay, and a
checkpoint that restores the trainer, its optimizer and the RNG states exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from rollout.loop import TaskSampler
from rollout.state.resume import (
    ResumeError,
    committed,
    open_resume,
    resume_config,
    supersede_uncommitted,
)
from rollout.state.run_state import STATE_FILE, RunState, read_state, write_state


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def fake_run(root: Path, iterations: int = 3, torn: bool = True) -> dict[str, list[dict]]:
    """A run directory as a killed run leaves it: records of iterations 0..iterations-1, evaluations 0..iterations,
    one resume row, an error row, and (torn) a last line cut short."""
    files: dict[str, list[dict]] = {"episodes.jsonl": [], "trajectories.jsonl": [], "eval_trajectories.jsonl": [],
                                    "metrics.jsonl": []}
    for k in range(iterations + 1):
        files["episodes.jsonl"].append({"episode_id": f"eval{k}-0", "split": "eval", "iteration": k})
        files["eval_trajectories.jsonl"].append({"episode_id": f"eval{k}-0", "step_index": 0, "iteration": k})
        files["metrics.jsonl"].append({"kind": "eval", "iteration": k, "accuracy": 0.5})
        if k < iterations:
            for j in range(2):
                files["episodes.jsonl"].append({"episode_id": f"it{k}-g0-s{j}", "split": "train", "iteration": k})
                files["trajectories.jsonl"] += [{"episode_id": f"it{k}-g0-s{j}", "step_index": t, "iteration": k}
                                                for t in range(2)]
            files["metrics.jsonl"].append({"kind": "train", "iteration": k})
    files["metrics.jsonl"].insert(1, {"kind": "resume", "resume": 1, "from_iteration": 0})
    files["metrics.jsonl"].append({"kind": "error", "iteration": iterations - 1, "stage": "trainer"})
    for name, rows in files.items():
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if torn and name == "trajectories.jsonl":
            text += '{"episode_id": "it2-g0-s1", "step_ind'  # the kill cut this write short
        (root / name).write_text(text)
    return files


def test_committed_follows_the_state():
    st = RunState(iterations_done=2, evals_done=[0, 2], resumes=1)
    assert committed({"split": "train", "iteration": 1}, "episodes.jsonl", st)
    assert not committed({"split": "train", "iteration": 2}, "episodes.jsonl", st)
    assert committed({"split": "eval", "iteration": 2}, "episodes.jsonl", st)
    assert not committed({"split": "eval", "iteration": 1}, "episodes.jsonl", st)
    assert not committed({"iteration": 2}, "trajectories.jsonl", st)
    assert not committed({"episode_id": "x"}, "trajectories.jsonl", st)  # untagged: not covered
    assert committed({"kind": "resume", "resume": 1}, "metrics.jsonl", st)
    assert not committed({"kind": "resume", "resume": 2}, "metrics.jsonl", st)  # written, then killed before commit
    assert not committed({"kind": "error", "iteration": 0}, "metrics.jsonl", st)


def test_supersede_moves_every_uncovered_line_once_and_keeps_the_rest_in_order(tmp_path):
    files = fake_run(tmp_path)
    st = RunState(iterations_done=2, evals_done=[0, 1, 2], resumes=1)
    rel, counts = supersede_uncommitted(tmp_path, st)
    assert rel == Path("superseded/resume2")
    for name, rows in files.items():
        kept, moved = _lines(tmp_path / name), _lines(tmp_path / rel / name) if (tmp_path / rel / name).exists() else []
        assert kept == [r for r in rows if committed(r, name, st)]  # order kept
        assert sorted(map(json.dumps, kept + moved)) == sorted(map(json.dumps, rows))  # nothing lost, nothing twice
        assert not any(committed(r, name, st) for r in moved)
    assert counts == {"episodes.jsonl": 3, "eval_trajectories.jsonl": 1, "metrics.jsonl": 3,
                      "trajectories.jsonl": 4, "trajectories.jsonl.torn": 1}
    assert (tmp_path / rel / "trajectories.jsonl.torn").read_text().startswith('{"episode_id": "it2-g0-s1"')
    assert (tmp_path / "trajectories.jsonl").read_bytes().endswith(b"}\n")  # an append starts a new line
    # a second resume from the same state finds nothing more to move and reports the same
    assert supersede_uncommitted(tmp_path, st) == (rel, counts)


def test_a_resume_killed_between_its_writes_can_be_run_again(tmp_path):
    """Killed after the moved lines were written but before the main file was replaced: run again, every line ends up
    in exactly one place."""
    files = fake_run(tmp_path, torn=False)
    original = (tmp_path / "trajectories.jsonl").read_bytes()
    st = RunState(iterations_done=1, evals_done=[0, 1])
    rel, counts = supersede_uncommitted(tmp_path, st)
    (tmp_path / "trajectories.jsonl").write_bytes(original)  # as if the replace had not happened
    assert supersede_uncommitted(tmp_path, st) == (rel, counts)
    kept, moved = _lines(tmp_path / "trajectories.jsonl"), _lines(tmp_path / rel / "trajectories.jsonl")
    assert len(kept) + len(moved) == len(files["trajectories.jsonl"])
    assert {r["iteration"] for r in kept} == {0} and {r["iteration"] for r in moved} == {1, 2}


def test_resume_config_keeps_the_run_and_names_every_conflict():
    saved = {"run": {"name": "a", "out_dir": "outputs/a", "resume": None}, "env": {"name": "gui", "max_steps": 4},
             "loop": {"iterations": 3, "seed": 0}, "farm": {"num_envs": 8}}
    composed = {"run": {"name": "b", "out_dir": "outputs/b", "resume": "outputs/a"},
                "env": {"name": "toolcall", "max_steps": 10}, "loop": {"iterations": 5, "seed": 0},
                "farm": {"num_envs": 8}}
    # only run.resume named: the run's own config, whatever the defaults composed
    out, changed = resume_config(saved, composed, ["run.resume=outputs/a"])
    assert out == saved and changed == {}
    # an option that may change on resume is taken from the command line
    out, changed = resume_config(saved, composed, ["run.resume=outputs/a", "loop.iterations=5"])
    assert out["loop"]["iterations"] == 5 and changed == {"loop.iterations": [3, 5]}
    with pytest.raises(ResumeError) as err:
        resume_config(saved, composed, ["env=toolcall", "loop.iterations=5"])
    assert "env.name: the run has 'gui', this command line 'toolcall'" in str(err.value)
    assert "env.max_steps" in str(err.value) and "loop.iterations" not in str(err.value).split("Options")[0]


def test_open_resume_refuses_what_cannot_be_resumed(tmp_path):
    with pytest.raises(ResumeError, match="no run there"):
        open_resume({"run": {"resume": str(tmp_path / "nothing")}}, [])
    (tmp_path / "config.yaml").write_text("run: {name: a, out_dir: x}\nloop: {iterations: 2}\n")
    write_state(tmp_path, RunState(iterations_done=2, finished=True))
    opened = open_resume({"run": {"resume": str(tmp_path)}, "loop": {"iterations": 2}}, [])
    assert opened.finished  # nothing to do
    with pytest.raises(ResumeError, match="below the 2 iterations"):
        open_resume({"run": {"resume": str(tmp_path)}, "loop": {"iterations": 1}}, ["loop.iterations=1"])
    # more iterations: the run goes on
    opened = open_resume({"run": {"resume": str(tmp_path)}, "loop": {"iterations": 4}}, ["loop.iterations=4"])
    assert not opened.finished and opened.config["loop"]["iterations"] == 4
    assert opened.config["run"]["out_dir"] == str(tmp_path)


def test_run_state_round_trips_atomically_and_rejects_unknown_content(tmp_path):
    st = RunState(run_name="r", iterations_done=3, evals_done=[0, 3], staleness={"0": 5})
    write_state(tmp_path, st)
    assert read_state(tmp_path) == st
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]  # no temporary file left
    assert read_state(tmp_path / "missing") is None
    (tmp_path / STATE_FILE).write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="format 99"):
        read_state(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({"format": 1, "surprise": 1}))
    with pytest.raises(ValueError, match="unknown keys"):
        read_state(tmp_path)


def test_the_task_sampler_replays_to_its_position():
    tasks = [{"id": str(i)} for i in range(7)]
    straight = TaskSampler(tasks, seed=3)
    draws = [straight.take(3) for _ in range(4)]
    resumed = TaskSampler(tasks, seed=3)
    resumed.skip(9)
    assert resumed.position == 9 and resumed.take(3) == draws[3]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_checkpoint_restores_trainer_optimizer_version_and_rng(tmp_path):
    import asyncio

    import torch
    from tiny_hf import tiny_model

    from rollout.state.checkpoint import CheckpointConfig, Checkpointer
    from train.backends.torch_backend import TorchTrainer
    from train.records import TrainSample

    class SeededPolicy:  # the policy's part of a checkpoint: its sampler's RNG
        def __init__(self):
            self.gen = torch.Generator().manual_seed(7)

        def rng_state(self):
            return self.gen.get_state()

        def set_rng_state(self, state):
            self.gen.set_state(state)

    def sample():
        return TrainSample(tokens=[1, 2, 3, 4], loss_mask=[0, 1, 1, 1], advantages=[0.0, 1.0, 1.0, 1.0],
                           rollout_logprobs=[0.0, -1.0, -1.0, -1.0])

    torch.manual_seed(0)
    trainer, policy = TorchTrainer(tiny_model()), SeededPolicy()
    trainer.train_step([sample()])
    ck = Checkpointer(tmp_path, CheckpointConfig(every=2, keep=1), trainer, policy, RunState())
    assert [ck.due(n, 5) for n in range(1, 6)] == [False, True, False, True, True]
    asyncio.run(ck.commit(RunState(iterations_done=1), trainer=True))
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=policy.gen)))
    trainer.train_step([sample()])  # what a resumed trainer must reproduce from the checkpoint
    expected = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    fresh_trainer, fresh_policy = TorchTrainer(tiny_model()), SeededPolicy()
    restored = Checkpointer(tmp_path, CheckpointConfig(), fresh_trainer, fresh_policy, read_state(tmp_path))
    random.random(), np.random.rand(), torch.rand(3), torch.rand(2, generator=fresh_policy.gen)  # move every RNG on
    restored.restore()
    assert fresh_trainer.version == 1 and read_state(tmp_path).weight_version == 1
    assert (random.random(), float(np.random.rand()), float(torch.rand(1)),
            float(torch.rand(1, generator=fresh_policy.gen))) == after
    fresh_trainer.train_step([sample()])
    for k, v in fresh_trainer.model.state_dict().items():
        assert torch.equal(v, expected[k]), k  # same weights and optimizer state: the same update
    # keep=1: a later commit replaces the checkpoint
    asyncio.run(ck.commit(RunState(iterations_done=2), trainer=True))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["it000002"]


def test_a_resumed_server_policy_serves_the_commits_weights_even_the_initial_ones(tmp_path):
    """A killed attempt may have sent the servers a version the run never committed; resuming from the initial weights
    (no trainer checkpoint yet) sends them those again, by the disk export servers load, before anything is sampled."""
    import asyncio

    from doubles import ScriptedPolicy
    from loop_support import ParityEnv, register, tiny_policy_and_model

    from prm.judge import RuleJudge
    from rollout.farm.core import FarmConfig, make_farm
    from rollout.loop import LoopConfig, ResumePoint, RLLoop, RunWriter
    from rollout.policy.base import SamplingParams
    from train.backends.torch_backend import TorchTrainer
    from train.batch import RewardConfig
    from train.config import TorchTrainerConfig

    class ServerLike(ScriptedPolicy):  # not in process: weights go by disk, as to SGLang servers
        def __init__(self):
            super().__init__()
            self.weight_version, self.loaded = 2, []  # what the killed attempt left the server serving

        async def update_weights(self, update):
            self.loaded.append((update.version, update.path, self.calls))
            await super().update_weights(update)

    register()
    _, model, tok = tiny_policy_and_model()
    policy = ServerLike()

    async def main():
        farm = make_farm("loop_parity", {}, FarmConfig(backend="local", num_envs=2))
        await farm.start()
        writer = RunWriter(tmp_path, False)
        try:
            loop = RLLoop(farm=farm, policy=policy, judge=RuleJudge(),
                          trainer=TorchTrainer(model, TorchTrainerConfig(lr=1e-3), tok), reward_cfg=RewardConfig(),
                          loop_cfg=LoopConfig(iterations=1, tasks_per_iteration=1, samples_per_task=2, eval_tasks=0,
                                              save_screenshots=False),
                          sampling=SamplingParams(max_new_tokens=4), run_id="t", train_tasks=ParityEnv.tasks(),
                          eval_tasks=[], writer=writer,
                          resume=ResumePoint(RunState(iterations_done=0, evals_done=[0], checkpoint=None)))
            await loop.run()
        finally:
            writer.close()
            await farm.close()

    asyncio.run(main())
    version, path, calls_before = policy.loaded[0]
    assert (version, calls_before) == (0, 0) and Path(path).name == "v0"  # the initial weights, before any sample
    steps = _lines(tmp_path / "trajectories.jsonl")
    assert steps and {s["weight_version"] for s in steps} == {0}  # nothing sampled by the uncommitted version 2
