"""CI-sized runs of the Table 4 experiments through the launcher (real envs, farm, judge, rewards, trainer), and a
recomputation of the report's numbers from the runs' metrics.jsonl, eval_trajectories.jsonl and trajectories.jsonl."""

import json
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from rollout.experiment.report import area_under_curve, summarize
from rollout.records import read_jsonl
from tests.experiment_smoke import TOOLCALL_SMOKE

pytestmark = pytest.mark.slow  # the experiment tier: whole experiments

REPO = Path(__file__).resolve().parent.parent



def launch(tmp_path: Path, overrides: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "exp"
    cmd = [sys.executable, "-m", "rollout.launch", *overrides, f"run.out_dir={out}",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, f"experiment failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc, out


def eval_accuracy_from_trajectories(run_dir: Path) -> dict[int, float]:
    """iteration -> fraction of held-out episodes whose last step has a positive outcome (last attempt of each)."""
    eps: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for s in read_jsonl(run_dir / "eval_trajectories.jsonl"):
        it = int(s["episode_id"].split("-")[0][4:])
        eps[(it, s["episode_id"].split("#retry")[0])].append(s)
    by_it: dict[int, list[bool]] = defaultdict(list)
    for (it, _), steps in eps.items():
        last = max(steps, key=lambda s: s["step_index"])
        by_it[it].append(last["status"] == "ok" and (last["outcome"] or 0) > 0)
    return {it: sum(v) / len(v) for it, v in by_it.items()}


def eval_curve_of(run_dir: Path) -> list[tuple[int, float]]:
    return [(m["iteration"], m["accuracy"]) for m in read_jsonl(run_dir / "metrics.jsonl") if m["kind"] == "eval"]


def check_report_against_raw_files(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    info = json.loads((out / "experiment.json").read_text())
    assert (out / "report.md").exists() and (out / "learning_curves.png").stat().st_size > 1000
    curves: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for r in info["runs"]:
        d = Path(r["out_dir"])
        key = (r["arm"], int(r["seed"]))
        # held-out accuracy: the report (from metrics.jsonl) equals a recount of eval_trajectories.jsonl
        recount = eval_accuracy_from_trajectories(d)
        metric = {m["iteration"]: m["accuracy"] for m in read_jsonl(d / "metrics.jsonl") if m["kind"] == "eval"}
        assert metric == pytest.approx(recount)
        curves[key] = sorted(recount.items())
        reported = report["run_curves"][f"{key[0]}/seed{key[1]}"]
        # iterations exactly, accuracies to rounding (pytest.approx compares flat sequences only, not pairs)
        assert [int(it) for it, _ in reported] == [it for it, _ in curves[key]]
        assert [acc for _, acc in reported] == pytest.approx([acc for _, acc in curves[key]])
        # dropped steps: the metrics' fraction equals a recount of the advantages in trajectories.jsonl
        steps = [s for s in read_jsonl(d / "trajectories.jsonl") if s["status"] == "ok"]
        per_it = defaultdict(list)
        for s in steps:
            per_it[int(s["episode_id"].split("-")[0][2:])].append(s["advantage"] is None)
        recount_drop = sum(sum(v) / len(v) for v in per_it.values()) / len(per_it)
        assert report["runs"][f"{key[0]}/seed{key[1]}"]["dropped_step_fraction"] == pytest.approx(recount_drop)
    for arm, a in report["arms"].items():
        seeds = sorted(s for (ar, s) in curves if ar == arm)
        aucs = [area_under_curve(curves[(arm, s)]) for s in seeds]
        assert a["auc"]["mean"] == pytest.approx(summarize(aucs)["mean"])
        threshold = report["threshold"]
        assert a["reach"]["per_seed"] == [next((it for it, acc in curves[(arm, s)] if acc >= threshold), None)
                                          for s in seeds]
        last = max(it for it, _ in curves[(arm, seeds[0])])
        assert a["curve"][str(last)]["mean"] == pytest.approx(sum(dict(curves[(arm, s)])[last] for s in seeds) / len(seeds))
    tune = info.get("tune")
    if tune:  # the sweep: each value's mean area from its runs' metrics.jsonl; the chosen one is what every arm ran with
        means = {}
        for value in tune["spec"]["values"]:
            aucs = [area_under_curve(eval_curve_of(Path(r["out_dir"]))) for r in tune["runs"]
                    if r["arm"] == f"{tune['spec']['key'].rsplit('.', 1)[-1]}_{value}"]
            means[value] = sum(aucs) / len(aucs)
            got = report["tune"]["values"][f"{tune['spec']['key'].rsplit('.', 1)[-1]}_{value}"]["auc"]["mean"]
            assert got == pytest.approx(means[value])
        # the best value, unless it beats the default (the config's trainer.lr) by less than min_gain
        best = max(means, key=means.get)
        default, min_gain = tune["spec"]["default"], tune["spec"]["min_gain"]
        want = default if min_gain and means[best] - means[default] < min_gain else best
        assert tune["chosen"] == want == report["tune"]["chosen"] == report["tune"]["best"]
        for r in info["runs"]:
            cfg = yaml.safe_load((Path(r["out_dir"]) / "config.yaml").read_text())
            assert cfg["trainer"]["lr"] == pytest.approx(tune["chosen"])
    for c in report["comparisons"]:
        paired = sorted({s for (ar, s) in curves if ar == c["a"]} & {s for (ar, s) in curves if ar == c["b"]})
        diffs = [area_under_curve(curves[(c["a"], s)]) - area_under_curve(curves[(c["b"], s)]) for s in paired]
        assert c["auc_difference"]["values"] == pytest.approx(diffs) and c["wins"] == sum(d > 0 for d in diffs)
    return report


# a small tool-call experiment in which the policy is really updated: a 60%-accurate judge gives the random start's
# steps scores that differ inside a bucket, so there are advantages, updates and later weight versions to compare
TOOLCALL_REPEAT = [
    "experiment=table4_toolcall", "experiment.seeds=[1,2]", "experiment.workers=2",
    "experiment.arms.dense_integrated=null", "experiment.arms.dense_outcome_only=null",
    "experiment.arms.integrated_judge80=null", "experiment.arms.outcome_only=null", "judge.accuracy=0.6",
    "loop.iterations=2", "loop.tasks_per_iteration=3", "loop.samples_per_task=3", "loop.eval_tasks=6",
    "loop.eval_every=1", "policy.warm_start.max_conversations=40", "policy.warm_start.sft.epochs=1",
    "policy.warm_start.stages.0.max_conversations=20", "policy.warm_start.stages.0.offset=40",
    "sampling.max_new_tokens=24", "env.max_steps=4", "farm.num_envs=16",
]


def per_seed_record(out: Path) -> dict[str, dict]:
    """Per run (arm/seed): every step's action, advantage and weight version, every held-out action, the curve."""
    runs = {}
    for r in json.loads((out / "experiment.json").read_text())["runs"]:
        d = Path(r["out_dir"])
        runs[f"{r['arm']}/seed{r['seed']}"] = {
            "steps": sorted((s["episode_id"], s["step_index"], s["action"], s["advantage"], s["weight_version"])
                            for s in read_jsonl(d / "trajectories.jsonl")),
            "eval": sorted((s["episode_id"], s["step_index"], s["action"]) for s in read_jsonl(d / "eval_trajectories.jsonl")),
            "curve": eval_curve_of(d),
        }
    return runs


@pytest.mark.integration
def test_the_same_experiment_twice_gives_the_same_runs(tmp_path):
    # two runs of one command, each from an empty cache (its own SFT), two seeds at once: batch composition, finishing
    # order and the two workers' timing differ between them; nothing a run records may
    _, first = launch(tmp_path / "first", TOOLCALL_REPEAT)
    _, second = launch(tmp_path / "second", TOOLCALL_REPEAT)
    a, b = per_seed_record(first), per_seed_record(second)
    assert set(a) == {"integrated/seed1", "integrated/seed2"}
    assert max(s[4] for s in a["integrated/seed1"]["steps"] + a["integrated/seed2"]["steps"]) >= 1  # it was updated
    for run in a:
        assert a[run] == b[run], f"{run} differs between two runs of the same command"
    assert json.loads((first / "report.json").read_text())["run_curves"] == \
        json.loads((second / "report.json").read_text())["run_curves"]


@pytest.mark.integration
def test_table4_toolcall_smoke(tmp_path):
    proc, out = launch(tmp_path, TOOLCALL_SMOKE)
    report = check_report_against_raw_files(out)
    assert set(report["arms"]) == {"integrated", "outcome_only", "integrated_judge80"}
    assert report["tune"] is not None and len(report["tune"]["values"]) == 2
    assert "## Tuning: `trainer.lr`" in (out / "report.md").read_text()
    assert "experiment done" in proc.stderr and "report" in proc.stderr
    # the arms differ only in the reward (and the judge's accuracy), never in anything else
    assert set(report["config_differences_between_arms"]) == {"reward.mode", "reward.coef", "judge.accuracy"}
    # every arm of a seed started from the same SFT checkpoint (one warm-start cache entry per seed... shared: seed 0)
    keys = {json.loads((Path(r["out_dir"]) / "warm_start.json").read_text())["_details"]["key"]
            for r in json.loads((out / "experiment.json").read_text())["runs"]}
    assert len(keys) == 1
    # the SFT check: the policy's step labels at weight version 0 are the recount of trajectories.jsonl
    sft = report["sft_check"][0]
    counts = defaultdict(Counter)
    for r in json.loads((out / "experiment.json").read_text())["runs"]:
        for s in read_jsonl(Path(r["out_dir"]) / "trajectories.jsonl"):
            if s["weight_version"] == 0 and s["status"] == "ok":
                counts[s["step_index"]][s["signals"]["mistake"]] += 1
    for i, c in counts.items():
        assert sft["policy_rates"][str(i)] == pytest.approx({k: n / sum(c.values()) for k, n in c.items()})
    assert set(sft["demo_rates"]["0"]) <= {"ok", "flipped_op"}  # the noisy stage's dominant mistake at step 0
    # the 80% judge really disagreed with the rule judge on some steps
    judged = [s for r in json.loads((out / "experiment.json").read_text())["runs"] if r["arm"] == "integrated_judge80"
              for s in read_jsonl(Path(r["out_dir"]) / "trajectories.jsonl")]
    assert any("noisy judge" in s["judge"]["raw"][0] for s in judged)


# a GUI experiment at smoke size: one iteration of 2 tasks x 2 samples, 2 held-out tasks, a 6-conversation start
GUI_SMOKE = ["loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
             "loop.eval_every=0", "policy.warm_start.max_conversations=6", "sampling.max_new_tokens=16",
             "env.max_steps=3", "farm.num_envs=4"]


def skip_without_desktops() -> None:
    for tool in ("Xvfb", "dbus-run-session", "xdotool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the GUI experiment needs local desktops")


@pytest.mark.integration
def test_table4_gui_bundled_smoke(tmp_path):
    """The earlier design: the 62 bundled tasks' recorded solutions as the start."""
    skip_without_desktops()
    overrides = ["experiment=table4_gui_bundled", "experiment.seeds=[1,2]", *GUI_SMOKE, "policy.warm_start.sft.epochs=1"]
    proc, out = launch(tmp_path, overrides)
    report = check_report_against_raw_files(out)
    assert set(report["arms"]) == {"integrated", "outcome_only"}
    assert set(report["config_differences_between_arms"]) == {"reward.mode", "reward.coef"}


@pytest.mark.integration
def test_table4_gui_smoke(tmp_path):
    """The multi-step design end to end: rendered clean (with the context loss) and noisy SFT stages, then both arms
    on live desktops; the report's demonstration side of the start's step labels is the GUI's labeler's."""
    skip_without_desktops()
    overrides = ["experiment=table4_gui", "experiment.seeds=[1]", *GUI_SMOKE,
                 "policy.warm_start.stages.0.max_conversations=6", "policy.warm_start.stages.0.offset=6"]
    proc, out = launch(tmp_path, overrides)
    report = check_report_against_raw_files(out)
    assert set(report["arms"]) == {"integrated", "outcome_only"}
    runs = json.loads((out / "experiment.json").read_text())["runs"]
    assert all(read_jsonl(Path(r["out_dir"]) / "trajectories.jsonl") for r in runs)  # both arms trained on episodes
    (sft,) = report["sft_check"]  # one start; its 6 noisy demonstrations' labels, in the env's mistake words
    assert sft["demo_stage"] == "noisy" and sft["demo_rates"]
    assert set(sft["demo_rates"]["0"]) <= {"ok", "wrong_name", "other_switch"}  # step 0's dominant mistakes


# the mix experiment at smoke size: 2 iterations of 1 group x 2 samples per family (weights 1 : 1), 2 held-out tasks
# per family, a start of 20 + 10 tool-call and 6 + 4 GUI demonstrations (no repeats)
MIX_SMOKE = [
    "experiment=mix_vs_single", "experiment.seeds=[1,2]", "loop.iterations=2", "loop.eval_every=1",
    "env.families.toolcall.weight=1.0", "env.families.gui.weight=1.0",
    "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
    'experiment.arms.single_toolcall=["env.families.gui.weight=0","loop.tasks_per_iteration=1"]',
    'experiment.arms.single_gui=["env.families.toolcall.weight=0","loop.tasks_per_iteration=1"]',
    "policy.warm_start.families.toolcall.max_conversations=20", "policy.warm_start.families.toolcall.repeat=1",
    "policy.warm_start.families.gui.max_conversations=6", "policy.warm_start.num_threads=1",
    "policy.warm_start.stages.0.families.toolcall.max_conversations=10",
    "policy.warm_start.stages.0.families.toolcall.repeat=1",
    "policy.warm_start.stages.0.families.gui.max_conversations=4",
    "farm.num_envs=8", "farm.families.gui.num_envs=2",
]


@pytest.mark.integration
def test_mix_vs_single_smoke(tmp_path):
    """The mix experiment end to end: one start on both families' shares, the mix and both single arms on the same
    start, per-family held-out curves of the trained families only, the paired per-family comparisons and the
    per-family throughput from the runs' own figures."""
    skip_without_desktops()
    proc, out = launch(tmp_path, MIX_SMOKE)
    report = check_report_against_raw_files(out)
    assert set(report["arms"]) == {"mix", "single_toolcall", "single_gui"}
    runs = json.loads((out / "experiment.json").read_text())["runs"]
    starts = [json.loads((Path(r["out_dir"]) / "warm_start.json").read_text()) for r in runs]
    assert len({s["_details"]["key"] for s in starts}) == 1  # one SFT start for every arm and seed
    assert starts[0]["conversations per family"] == {"toolcall": 20, "gui": 6}
    assert [st["conversations"] for st in starts[0]["_details"]["stages"]] == [26, 14]
    arms = report["arms"]
    assert set(arms["mix"]["families"]) == {"toolcall", "gui"}  # loop.eval_untrained=false: only trained families
    assert set(arms["single_toolcall"]["families"]) == {"toolcall"} and set(arms["single_gui"]["families"]) == {"gui"}
    assert {(c["a"], c["b"], c["family"], c["pairs"]) for c in report["family_comparisons"]} == {
        ("mix", "single_toolcall", "toolcall", 2), ("mix", "single_gui", "gui", 2)}
    # equal per-family data: each family's episodes per iteration in the mix are its single arm's (1 group x 2)
    tp = {(a, f): t["episodes_per_iteration"]["mean"] for a, v in arms.items()
          for f, t in v["family_throughput"].items()}
    assert tp == {("mix", "toolcall"): 2, ("mix", "gui"): 2, ("single_toolcall", "toolcall"): 2,
                  ("single_gui", "gui"): 2}
    assert all(c["throughput_ratio"]["n"] == 2 for c in report["family_comparisons"])
    md = (out / "report.md").read_text()
    assert "### Per-family throughput (training rollouts)" in md and "| toolcall | mix / single_toolcall |" in md


@pytest.mark.integration
def test_table4_gui_llm_judge_sends_both_screenshots_and_three_votes_to_our_policy_server(tmp_path):
    skip_without_desktops()
    from serving_helpers import model_server, stats

    with model_server() as srv:  # the project's own OpenAI-compatible server, a real (tiny, text-only) model
        overrides = [
            "experiment=table4_gui_llm_judge", f"judge.url={srv.url}/v1", "judge.max_tokens=16", "experiment.seeds=[1]",
            "loop.iterations=1", "loop.tasks_per_iteration=2", "loop.samples_per_task=2", "loop.eval_tasks=2",
            "loop.eval_every=0", "policy.warm_start.max_conversations=6", "policy.warm_start.sft.epochs=1",
            "sampling.max_new_tokens=16", "env.max_steps=2", "farm.num_envs=4", "experiment.workers=1",
            "experiment.arms.outcome_only=null",  # the integrated arm is the one that uses the votes
        ]
        launch(tmp_path, overrides)
        served = stats(srv)
    runs = json.loads((tmp_path / "exp" / "experiment.json").read_text())["runs"]
    judged = [s for r in runs for s in read_jsonl(Path(r["out_dir"]) / "trajectories.jsonl") if s["judge"]]
    assert judged and all(len(s["judge"]["raw"]) == 3 for s in judged)  # m=3 votes per step
    assert not any(r.startswith("<judge request failed") for s in judged for r in s["judge"]["raw"])  # answered
    requests = served["requests:/v1/chat/completions"]
    assert requests >= 3 and served["images_received"] == 2 * requests  # before and after in every vote's messages


def test_a_killed_experiment_driver_leaves_no_run_behind(tmp_path):
    """SIGKILL the driver while its worker processes run: the kernel's parent-death signal stops them (and their
    children), instead of leaving them training for minutes with nobody to collect the result."""
    import os
    import signal
    import time

    import psutil
    out = tmp_path / "exp"
    cmd = [sys.executable, "-m", "rollout.launch", *TOOLCALL_SMOKE, f"run.out_dir={out}",
           f"policy.warm_start.cache_dir={tmp_path / 'cache'}"]
    driver = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc = psutil.Process(driver.pid)
        workers: list = []
        while not workers:  # the runs have started once a run.log exists and a worker is alive
            assert driver.poll() is None, "the experiment ended before it could be killed"
            if list(out.glob("**/run.log")):
                workers = [c for c in proc.children(recursive=True) if "multiprocessing" in " ".join(c.cmdline())]
            time.sleep(0.5)
        everything = proc.children(recursive=True)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        _, alive = psutil.wait_procs(everything, timeout=120)
        assert not alive, f"left running after the driver died: {[(p.pid, p.cmdline()[:4]) for p in alive]}"
    finally:
        if driver.poll() is None:
            os.kill(driver.pid, signal.SIGKILL)
