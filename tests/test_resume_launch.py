"""`kill -9` and `run.resume`, as a user does it: a launch SIGKILLed mid-iteration and resumed finishes with every
iteration once, the planned episodes and trained samples, and episodes.jsonl / trajectories.jsonl / metrics.jsonl
that agree with each other (what was redone set aside under superseded/, and said in a `kind: resume` row); its
TensorBoard events, read with TensorBoard's own reader, hold each iteration once. An experiment killed between its
runs keeps the finished run and restarts the other. A resume started from anywhere logs into the run it resumes: no new
`outputs/<now>/` where it was started."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from rollout.config import resume_logs_in_place
from rollout.records import read_jsonl

REPO = Path(__file__).resolve().parent.parent
ITERATIONS, TASKS, SAMPLES = 3, 2, 3
RUN = [
    "env=toolcall", f"loop.iterations={ITERATIONS}", f"loop.tasks_per_iteration={TASKS}",
    f"loop.samples_per_task={SAMPLES}", "loop.eval_tasks=3", "loop.eval_every=2", "loop.max_staleness=1",
    "policy.warm_start.max_conversations=48", "policy.warm_start.sft.epochs=1", "env.max_steps=3",
    "sampling.max_new_tokens=32", "run.loggers=[tensorboard]",
]


def launch_cmd(*overrides: str) -> list[str]:
    return [sys.executable, "-m", "rollout.launch", *overrides]


def resume_elsewhere(where: Path, *overrides: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m rollout.launch run.resume=...` started in another directory than the run's (`where`, created)."""
    where.mkdir()
    return subprocess.run(launch_cmd(*overrides), cwd=where, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def wait_then_kill(proc: subprocess.Popen, ready, what: str, timeout: float = 900) -> None:
    t0 = time.time()
    while not ready():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the launch ended (rc {proc.returncode}) before {what}:\n{out[-4000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _state(out: Path) -> dict:
    try:
        return json.loads((out / "run_state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _records(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written right now
    return rows


def mid_iteration(out: Path) -> bool:
    """A commit after iteration 0 or later, and records on disk that it does not cover (the next iteration's)."""
    done = _state(out).get("iterations_done", 0)
    return 1 <= done < ITERATIONS and any(
        e.get("split") == "train" and e.get("iteration", -1) >= done for e in _records(out / "episodes.jsonl"))


def check_consistent(out: Path) -> dict:
    """Every iteration once, the planned episodes, and the files agreeing with each other and with the books."""
    metrics = read_jsonl(out / "metrics.jsonl")
    train = [m for m in metrics if m["kind"] == "train"]
    assert [m["iteration"] for m in train] == list(range(ITERATIONS))
    assert Counter(m["iteration"] for m in metrics if m["kind"] == "eval") == {0: 1, 2: 1, 3: 1}
    episodes = [e for e in read_jsonl(out / "episodes.jsonl") if e["split"] == "train"]
    assert len({e["episode_id"] for e in episodes}) == len(episodes), "an episode is on record twice"
    final = {e["episode_id"].split("#retry")[0]: e for e in episodes}
    assert Counter(e["iteration"] for e in final.values()) == {k: TASKS * SAMPLES for k in range(ITERATIONS)}
    steps = read_jsonl(out / "trajectories.jsonl")
    keys = [(s["episode_id"], s["step_index"]) for s in steps]
    assert len(set(keys)) == len(keys), "a step is on record twice"
    by_episode = Counter(s["episode_id"] for s in steps)
    assert by_episode == {e["episode_id"]: e["num_steps"] for e in episodes if e["num_steps"]}
    for s in steps:
        assert s["iteration"] == int(s["episode_id"].split("-")[0][2:])
    # the books: each iteration's produced samples (step layout: one per scored step) are those on record
    scored = Counter(s["iteration"] for s in steps if s["advantage"] is not None and s["output_tokens"] > 0)
    for row in train:
        assert row["produced"] == scored[row["iteration"]]
        # the planned samples trained: with loop.max_staleness=1 none is too stale, none from a future version, so
        # each iteration trains exactly the scored steps of its planned episodes (no sample lost or doubled by the kill;
        # a step without a gradient, advantage None, is no sample)
        assert row["dropped_stale"] == row["dropped_future"] == 0 and row["trained"] == row["produced"]
    state = json.loads((out / "run_state.json").read_text())
    assert state["finished"] and state["iterations_done"] == ITERATIONS
    assert state["trained"] == sum(r["trained"] for r in train) and state["produced"] == sum(scored.values())
    assert state["weight_version"] == train[-1]["weight_version"]
    return state


@pytest.mark.integration
@pytest.mark.slow  # a whole launch, killed and resumed
def test_a_launch_killed_mid_iteration_resumes_into_one_consistent_run(tmp_path):
    out = tmp_path / "run"
    common = [*RUN, f"run.out_dir={out}", f"policy.warm_start.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.Popen(launch_cmd(*common), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_then_kill(proc, lambda: mid_iteration(out), "a commit with later records on disk")
    before = _state(out)
    superseded_train = [e for e in _records(out / "episodes.jsonl")
                        if e.get("split") == "train" and e.get("iteration", -1) >= before["iterations_done"]]
    assert superseded_train

    res = subprocess.run(launch_cmd(*common, f"run.resume={out}"), cwd=REPO, capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, f"resume failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    state = check_consistent(out)
    assert state["resumes"] == 1
    resume_rows = [m for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "resume"]
    assert len(resume_rows) == 1 and resume_rows[0]["from_iteration"] == before["iterations_done"]
    moved = out / resume_rows[0]["superseded_dir"]
    assert resume_rows[0]["superseded"]["episodes.jsonl"] == len(read_jsonl(moved / "episodes.jsonl"))
    redone = {e["episode_id"] for e in read_jsonl(moved / "episodes.jsonl") if e["split"] == "train"}
    assert {e["episode_id"] for e in superseded_train} <= redone  # what the kill left is set aside, not lost
    # the resumed trainer started from the checkpoint's version and went on from there
    train = [m for m in read_jsonl(out / "metrics.jsonl") if m["kind"] == "train"]
    assert train[before["iterations_done"]]["trainer_version_before"] == before["weight_version"]

    # TensorBoard (its own reader): each iteration once, the superseded attempt's steps purged
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/accuracy")] == list(range(ITERATIONS))
    assert [e.step for e in acc.Scalars("eval/accuracy")] == [0, 2, 3]
    assert [e.value for e in acc.Scalars("train/produced")] == pytest.approx([r["produced"] for r in train])
    assert "config/text_summary" in acc.Tags()["tensors"]

    # resuming a finished run does nothing, and says so
    again = resume_elsewhere(tmp_path / "elsewhere", f"run.resume={out}", timeout=600)
    assert again.returncode == 0 and "has finished its 3 iterations" in again.stdout
    assert not list((tmp_path / "elsewhere").iterdir())  # its log went to the run's launch.log, not outputs/<now>/


EXPERIMENT = [
    "experiment=table4_toolcall", "experiment.seeds=[1,2]", "experiment.workers=1", "experiment.tune=null",
    "experiment.arms.outcome_only=null", "experiment.arms.integrated_judge80=null",
    "experiment.arms.dense_integrated=null", "experiment.arms.dense_outcome_only=null",
    "loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
    "loop.eval_every=0", "policy.warm_start.max_conversations=32", "policy.warm_start.sft.epochs=1",
    "policy.warm_start.stages.0.max_conversations=16", "policy.warm_start.stages.0.offset=32",
    "sampling.max_new_tokens=24", "env.max_steps=3", "farm.num_envs=8",
]


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.integration
@pytest.mark.slow  # a whole launch, killed and resumed
def test_an_experiment_killed_between_runs_keeps_the_finished_run_and_restarts_the_other(tmp_path):
    exp = tmp_path / "exp"
    cmd = launch_cmd(*EXPERIMENT, f"run.out_dir={exp}", f"policy.warm_start.cache_dir={tmp_path / 'cache'}")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_then_kill(proc, lambda: len(_records(exp / "runs.jsonl")) == 1, "the first run to finish")
    first = _records(exp / "runs.jsonl")[0]
    assert first["rc"] == 0
    kept_files = _digest(Path(first["out_dir"]))
    time.sleep(1)  # the killed driver's worker gets SIGTERM (PDEATHSIG) and unwinds its run

    log_before = (exp / "launch.log").stat().st_size
    res = resume_elsewhere(tmp_path / "elsewhere", f"run.resume={exp}", timeout=1800)
    assert res.returncode == 0, f"experiment resume failed:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert not list((tmp_path / "elsewhere").iterdir()) and (exp / "launch.log").stat().st_size > log_before
    said = " ".join(res.stderr.split())  # rich wraps its lines
    assert "1 finished runs kept" in said and "kept (it finished before the resume)" in said
    runs = read_jsonl(exp / "runs.jsonl")
    assert sorted((r["arm"], r["seed"], r["rc"]) for r in runs) == [("integrated", 1, 0), ("integrated", 2, 0)]
    assert _digest(Path(first["out_dir"])) == kept_files  # the finished run was left as it was
    other = next(Path(r["out_dir"]) for r in runs if r["out_dir"] != first["out_dir"])
    assert [m["iteration"] for m in read_jsonl(other / "metrics.jsonl") if m["kind"] == "train"] == [0]
    report = json.loads((exp / "report.json").read_text())
    assert set(report["runs"]) == {"integrated/seed1", "integrated/seed2"}
    info = json.loads((exp / "experiment.json").read_text())
    assert len(info["resumed"]) == 1 and info["command"][3:] == cmd[3:]
    moved = defaultdict(list)
    for p in (exp / "superseded").rglob("metrics.jsonl"):
        moved[p.parent.name].append(p)
    assert set(moved) <= {other.name}  # only the interrupted run (if it had started) was set aside


def test_a_dry_run_names_a_resume_directory_that_holds_no_run(tmp_path):
    proc = subprocess.run(launch_cmd("env=toolcall", f"run.resume={tmp_path / 'no-such-run'}", "run.dry_run=true",
                                     f"run.out_dir={tmp_path / 'dry-run'}"),
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the table's cells wrap where a long tmp_path (xdist's popen-gwN/) falls: read the words, not the lines
    words = " ".join(proc.stdout.replace("│", " ").split())
    assert "FAILED" in words and "ResumeError: run.resume=" in words


def test_a_resume_logs_into_the_run_it_resumes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    once = resume_logs_in_place([f"run.resume={run}"])
    assert once == [f"run.resume={run}", f"hydra.run.dir={run}"] and resume_logs_in_place(once) == once
    kept = ([f"run.resume={run}", "run.out_dir=x"], [f"run.resume={run}", "hydra.run.dir=y"],
            [f"run.resume={tmp_path / 'none'}"], ["run.resume=null"], ["env=toolcall"])
    for given in kept:  # an out dir of its own, a directory that is not there (the resume says why), no resume
        assert resume_logs_in_place(list(given)) == list(given)
