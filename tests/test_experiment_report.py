"""Experiment planning and the report's statistics, on hand-made run directories (no training)."""

import json
import math
from pathlib import Path

import pytest
import yaml

from rollout.experiment.core import ExperimentSpec, merge_overrides, override_key, plan_runs
from rollout.experiment.report import (
    area_under_curve,
    compute_report,
    config_differences,
    first_reaching,
    render_markdown,
    summarize,
    write_report,
)


def test_summary_statistics():
    s = summarize([0.2, 0.4, 0.6])
    assert s["mean"] == pytest.approx(0.4) and s["sd"] == pytest.approx(0.2)
    half = 4.302652729911275 * 0.2 / math.sqrt(3)  # t_{0.975, 2}
    assert (s["lo"], s["hi"]) == (pytest.approx(0.4 - half), pytest.approx(0.4 + half))
    assert summarize([0.5])["sd"] is None and summarize([])["mean"] is None
    assert area_under_curve([(0, 0.0), (10, 1.0)]) == pytest.approx(0.5)
    assert area_under_curve([(10, 1.0), (0, 0.0), (20, 1.0)]) == pytest.approx(0.75)  # order does not matter
    assert first_reaching([(0, 0.1), (5, 0.85), (10, 0.9)], 0.8) == 5 and first_reaching([(0, 0.1)], 0.8) is None


def test_spec_overrides_and_plan(tmp_path):
    spec = ExperimentSpec(seeds=[1, 2], arms={"a": ["reward=integrated"], "b": ["reward=outcome_only"], "c": None},
                          comparisons=[["a", "b"], ["a", "c"]])
    assert list(spec.arms) == ["a", "b"] and spec.comparisons == [["a", "b"]]  # null arms and their pairs dropped
    with pytest.raises(ValueError, match="distinct"):
        ExperimentSpec(seeds=[1, 1], arms={"a": []})
    with pytest.raises(ValueError, match="two arm names"):
        ExperimentSpec(arms={"a": []}, comparisons=[["a"]])
    assert override_key("+a.b=1") == "a.b" and merge_overrides(["x=1", "y=2"], ["x=3"]) == ["y=2", "x=3"]
    jobs = plan_runs(spec, ["experiment=e", "reward=outcome_only", "hydra.run.dir=z", "run.out_dir=q"], tmp_path, "e1")
    assert [(j.arm, j.seed) for j in jobs] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]  # arm-major
    a1 = jobs[0].overrides
    assert "reward=integrated" in a1 and "reward=outcome_only" not in a1  # the arm wins over the command line
    assert f"run.out_dir={tmp_path / 'a' / 'seed1'}" in a1 and "run.seed=1" in a1 and "experiment.arms=null" in a1
    assert not any(o.startswith("hydra.") for o in a1)
    # an arm with fewer seeds (a control): only those runs; seeds outside experiment.seeds are an error
    spec2 = ExperimentSpec(seeds=[1, 2, 3], arms={"a": [], "b": []}, arm_seeds={"b": [1, 3]})
    assert [(j.arm, j.seed) for j in plan_runs(spec2, [], tmp_path, "e")] == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 3)]
    assert ExperimentSpec(seeds=[1, 2], arms={"a": []}, arm_seeds={"a": [1, 3]}).seeds_of("a") == [1]
    with pytest.raises(ValueError, match="arm_seeds"):
        ExperimentSpec(seeds=[1, 2], arms={"a": []}, arm_seeds={"a": [3]})


def _fake_run(d, curve, train_rows, steps, cfg, demo=None):
    d.mkdir(parents=True)
    rows = [{"kind": "eval", "iteration": i, "accuracy": a} for i, a in curve]
    rows += [{"kind": "train", "iteration": i, "accuracy": a, "mean_step_score": 0.0, "dropped_buckets": db,
              "buckets": 10, "dropped_step_fraction": df} for i, a, db, df in train_rows]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "trajectories.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if demo is not None:
        (d / "warm_start.json").write_text(json.dumps({"_details": {"key": "k1", "stages": [{"name": "sft"}],
                                                                    "demonstration_labels": {"sft": demo}}}))


def step(ep, i, label, version=0, parse_error=False):
    return {"episode_id": ep, "step_index": i, "weight_version": version, "status": "ok",
            "signals": {"mistake": label, "parse_error": parse_error}}


def test_report_numbers_from_hand_made_runs(tmp_path):
    spec = {"name": "t", "seeds": [1, 2], "arms": {"a": ["reward=integrated"], "b": ["reward=outcome_only"]},
            "comparisons": [["a", "b"]], "threshold": 0.5, "headline_iteration": 5, "collapse_drop": 0.2,
            "collapse_malformed": 0.5}
    runs = []
    curves = {("a", 1): [(0, 0.0), (5, 0.6), (10, 0.8)], ("a", 2): [(0, 0.0), (5, 0.4), (10, 0.6)],
              ("b", 1): [(0, 0.0), (5, 0.2), (10, 0.3)], ("b", 2): [(0, 0.0), (5, 0.5), (10, 0.1)]}
    for (arm, seed), curve in curves.items():
        d = tmp_path / arm / f"seed{seed}"
        steps = [step("it0-g0-s0", 0, "flipped_op"), step("it0-g0-s1", 0, "ok"),
                 step("it9-g0-s0", 0, "ok", 9, parse_error=(arm, seed) == ("b", 2))]
        cfg = {"reward": {"mode": "integrated" if arm == "a" else "outcome_only"}, "run": {"seed": seed}}
        _fake_run(d, curve, [(0, 0.1, 2, 0.2), (9, 0.3, 4, 0.4)], steps, cfg,
                  demo={"0": {"ok": 0.4, "flipped_op": 0.6}})
        runs.append({"arm": arm, "seed": seed, "out_dir": str(d)})
    (tmp_path / "experiment.json").write_text(json.dumps({"spec": spec, "runs": runs, "command": ["python"]}))
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps({**r, "rc": 0, "wall_s": 10.0}) + "\n" for r in runs))
    r = compute_report(tmp_path)
    a = r["arms"]["a"]
    assert a["curve"][5]["mean"] == pytest.approx(0.5) and a["curve"][10]["values"] == [0.8, 0.6]
    auc = {k: area_under_curve(v) for k, v in curves.items()}
    assert a["auc"]["mean"] == pytest.approx((auc[("a", 1)] + auc[("a", 2)]) / 2)
    c = r["comparisons"][0]
    diffs = [auc[("a", s)] - auc[("b", s)] for s in (1, 2)]
    assert c["auc_difference"]["values"] == pytest.approx(diffs) and c["wins"] == sum(x > 0 for x in diffs)
    assert c["at_headline"]["values"] == pytest.approx([0.4, -0.1])
    assert a["reach"]["per_seed"] == [5, 10] and r["arms"]["b"]["reach"]["per_seed"] == [None, 5]
    assert a["dropped_bucket_fraction"]["mean"] == pytest.approx(6 / 20)
    assert a["dropped_step_fraction"]["mean"] == pytest.approx(0.3)
    assert r["runs"]["b/seed2"]["collapse"]  # fell from 0.5 to 0.1, and its last iteration was all malformed
    assert not r["runs"]["a/seed1"]["collapse"]
    sft = r["sft_check"][0]
    assert sft["policy_rates"][0] == {"flipped_op": 0.5, "ok": 0.5}  # weight-version-0 steps of all runs
    assert sft["demo_rates"][0] == {"ok": 0.4, "flipped_op": 0.6}
    assert r["config_differences_between_arms"] == {"reward.mode": {"a": "integrated", "b": "outcome_only"}}
    md = render_markdown(r)
    assert "| a − b |" in md and "0.500" in md and "b/seed2" in md
    out = write_report(tmp_path)
    assert out.exists() and (tmp_path / "learning_curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "report.json").read_text())["arms"]["a"]["auc"]["mean"] == pytest.approx(
        a["auc"]["mean"])


def test_gap_by_verdict_averages_the_hinted_steps_of_one_iteration_by_score_sign():
    from rollout.experiment.report import gap_by_verdict

    def row(ep, score, mean):
        return {"episode_id": ep, "judge": {"score": score}, "teacher_gap": None if mean is None else {"mean": mean}}

    steps = [row("it0-g0-s0", 1.0, 0.2), row("it0-g0-s1", 0.5, 0.4), row("it0-g1-s0", -1.0, -2.0),
             row("it0-g1-s1", 0.0, None), row("it1-g0-s0", 1.0, 9.0), row("it10-g0-s0", -1.0, 9.0)]
    assert gap_by_verdict(steps, 0) == {"right (+1)": pytest.approx(0.3), "consistent (0)": None, "wrong (-1)": -2.0}
    assert gap_by_verdict(steps, 1)["right (+1)"] == 9.0 and gap_by_verdict(steps, 1)["wrong (-1)"] is None


def test_config_differences_ignore_run_keys():
    d = config_differences({"x": {"run": {"seed": 1}, "a": 1, "b": {"c": 2}},
                            "y": {"run": {"seed": 2}, "a": 1, "b": {"c": 3}}})
    assert d == {"b.c": {"x": 2, "y": 3}}


def test_tune_spec_plan_and_choice(tmp_path):
    from rollout.experiment.core import TuneSpec, choose_tuned_value, plan_tune_runs
    from rollout.experiment.report import tune_summary

    arms = {"a": ["reward=integrated"], "b": ["reward=outcome_only"]}
    with pytest.raises(ValueError, match="evaluation seeds"):
        ExperimentSpec(seeds=[1, 2], arms=arms, tune={"arm": "b", "values": [1, 2], "seeds": [2, 3]})
    with pytest.raises(ValueError, match="not an arm"):
        ExperimentSpec(seeds=[1], arms=arms, tune={"arm": "c", "values": [1, 2]})
    with pytest.raises(ValueError, match="at least two"):
        TuneSpec(values=[1e-3])
    spec = ExperimentSpec(seeds=[1], arms=arms, tune={"arm": "b", "key": "trainer.lr", "values": [1e-4, 1e-3, 1e-2],
                                                      "seeds": [101, 102], "overrides": ["loop.iterations=5"]})
    jobs = plan_tune_runs(spec.tune, arms["b"], ["experiment=e", "trainer.lr=5"], tmp_path, "e1")
    assert [(j.arm, j.seed) for j in jobs] == [(f"lr_{v}", s) for v in (1e-4, 1e-3, 1e-2) for s in (101, 102)]
    o = jobs[0].overrides
    assert "reward=outcome_only" in o and "loop.iterations=5" in o and "trainer.lr=0.0001" in o and "trainer.lr=5" not in o
    assert f"run.out_dir={tmp_path / 'tune' / 'lr_0.0001' / 'seed101'}" in o
    # areas: lr=1e-4 -> 0.2, lr=1e-3 -> 0.5 (best), lr=1e-2 -> one seed failed, the other 0.4
    curves = {("lr_0.0001", 101): [(0, 0.2), (10, 0.2)], ("lr_0.0001", 102): [(0, 0.2), (10, 0.2)],
              ("lr_0.001", 101): [(0, 0.2), (10, 0.8)], ("lr_0.001", 102): [(0, 0.3), (10, 0.7)],
              ("lr_0.01", 101): [(0, 0.4), (10, 0.4)]}
    for j in jobs:
        if (j.arm, j.seed) in curves:
            d = Path(j.out_dir)
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "iteration": i, "accuracy": a}) + "\n"
                                                    for i, a in curves[(j.arm, j.seed)]))
    chosen, scores = choose_tuned_value(spec.tune, jobs)
    assert chosen == 1e-3 and scores["lr_0.001"] == pytest.approx(0.5) and scores["lr_0.01"] == pytest.approx(0.4)
    from dataclasses import asdict

    t = tune_summary({"spec": asdict(spec.tune), "runs": [asdict(j) for j in jobs], "chosen": chosen})
    assert t["best"] == t["chosen"] == 1e-3 and t["values"]["lr_0.01"]["missing_seeds"] == [102]
    assert t["values"]["lr_0.001"]["last"]["mean"] == pytest.approx(0.75)
    # with a default and a minimum gain: 1e-3 beats the default 1e-2 by 0.1 -> switch at min_gain 0.05, keep at 0.2
    for min_gain, want in ((0.05, 1e-3), (0.2, 1e-2)):
        tuned = TuneSpec(**{**asdict(spec.tune), "default": 1e-2, "min_gain": min_gain})
        assert choose_tuned_value(tuned, jobs)[0] == want
        t = tune_summary({"spec": asdict(tuned), "runs": [asdict(j) for j in jobs], "chosen": want})
        assert t["best"] == t["chosen"] == want


def test_pick_tuned_value_keeps_the_default_on_a_flat_sweep():
    from rollout.experiment.core import TuneSpec, pick_tuned_value

    values = [3e-4, 1e-3, 3e-3]
    assert pick_tuned_value(values, [0.036, 0.029, 0.011]) == 3e-4  # plain argmax
    assert pick_tuned_value(values, [0.036, 0.029, 0.011], default=1e-3, min_gain=0.02) == 1e-3  # within noise
    assert pick_tuned_value(values, [0.080, 0.029, 0.011], default=1e-3, min_gain=0.02) == 3e-4  # a real gain
    assert pick_tuned_value(values, [0.036, None, 0.011], default=1e-3, min_gain=0.02) == 3e-4  # default's runs failed
    assert pick_tuned_value(values, [None, None, None], default=1e-3, min_gain=0.02) is None
    assert pick_tuned_value(values, [0.03, 0.03, 0.01]) == 3e-4  # a tie: the first listed
    with pytest.raises(ValueError, match="one of the swept values"):
        TuneSpec(values=values, default=1e-2, min_gain=0.02)
    with pytest.raises(ValueError, match="min_gain"):
        TuneSpec(values=values, min_gain=-1)


def test_start_identity_groups_runs_that_share_an_sft_start():
    from rollout.experiment.core import start_identity

    def cfg(seed, reward="integrated", ws_seed=0, rates=(0.5,), ptype="local"):
        return {"run": {"seed": seed}, "reward": {"mode": reward}, "trainer": {"lr": 1e-3},
                "env": {"name": "toolcall", "task_set": "chain"},
                "policy": {"type": ptype, "warm_start": {"enabled": True, "seed": ws_seed, "rates": list(rates)}}}

    # arms and seeds share the start: only the policy and env configs matter (reward, trainer, seed do not)
    assert start_identity(cfg(1)) == start_identity(cfg(2, reward="outcome_only"))
    assert start_identity(cfg(1)) != start_identity(cfg(1, rates=(0.0,)))  # the dense-start control's own start
    assert start_identity(cfg(1, ws_seed=None)) != start_identity(cfg(2, ws_seed=None))  # a start per seed
    assert start_identity(cfg(1, ptype="sglang")) is None
    no_ws = cfg(1)
    no_ws["policy"]["warm_start"]["enabled"] = False
    assert start_identity(no_ws) is None


def test_per_family_figures_and_paired_family_comparisons(tmp_path):
    """env=mix runs: each family's held-out curve from the eval rows' family/<f>/accuracy keys, per arm, and the
    paired mix - single differences of experiment.family_comparisons."""
    curves = {  # (arm, seed) -> family -> [(iteration, accuracy)]
        ("mix", 1): {"a": [(0, 0.2), (4, 0.6)], "b": [(0, 0.1), (4, 0.1)]},
        ("mix", 2): {"a": [(0, 0.2), (4, 0.4)], "b": [(0, 0.1), (4, 0.3)]},
        ("single_a", 1): {"a": [(0, 0.2), (4, 0.5)], "b": [(0, 0.1), (4, 0.0)]},
        ("single_a", 2): {"a": [(0, 0.2), (4, 0.5)], "b": [(0, 0.1), (4, 0.1)]},
    }
    runs = []
    for (arm, seed), fams in curves.items():
        d = tmp_path / arm / f"seed{seed}"
        d.mkdir(parents=True)
        rows = [{"kind": "eval", "iteration": it, "accuracy": sum(f[k][1] for f in fams.values()) / len(fams),
                 **{f"family/{f}/accuracy": pts[k][1] for f, pts in fams.items()}} for k, it in enumerate((0, 4))]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append({"arm": arm, "seed": seed, "out_dir": str(d)})
    spec = {"name": "m", "arms": {"mix": [], "single_a": []}, "family_comparisons": [["mix", "single_a", "a"]]}
    (tmp_path / "experiment.json").write_text(json.dumps({"spec": spec, "runs": runs}))
    r = compute_report(tmp_path)
    mix_a = r["arms"]["mix"]["families"]["a"]
    assert mix_a["last"]["mean"] == pytest.approx(0.5) and mix_a["gain"]["mean"] == pytest.approx(0.3)
    assert r["arms"]["single_a"]["families"]["b"]["last"]["mean"] == pytest.approx(0.05)  # a family it never trained
    (c,) = r["family_comparisons"]
    assert c["family"] == "a" and c["pairs"] == 2 and c["wins"] == 1
    assert c["last_difference"]["values"] == pytest.approx([0.1, -0.1])
    md = render_markdown(r)
    assert "## Held-out accuracy per family" in md and "| a | mix − single_a |" in md


def test_per_family_throughput_and_its_paired_ratio(tmp_path):
    """Each trained family's training rollouts from the train rows' family/<f>/* figures (a family of weight 0 has
    none), per arm, and the paired ratio of its env steps per second (mix / single) per family comparison."""
    fams = {  # (arm, seed) -> family -> per-iteration (episodes, env_steps, samples, rollout_s)
        ("mix", 1): {"a": (8, 40, 8, 4.0), "b": (4, 20, 4, 10.0)},
        ("mix", 2): {"a": (8, 40, 8, 5.0), "b": (4, 20, 4, 10.0)},
        ("single_a", 1): {"a": (8, 40, 8, 2.0)},
        ("single_a", 2): {"a": (8, 40, 8, 2.5)},
    }
    runs = []
    for (arm, seed), per in fams.items():
        d = tmp_path / arm / f"seed{seed}"
        d.mkdir(parents=True)
        rows = [{"kind": "eval", "iteration": it, "accuracy": 0.1, "family/a/accuracy": 0.1, "family/b/accuracy": 0.1}
                for it in (0, 2)]
        for it in (0, 1):
            row = {"kind": "train", "iteration": it, "accuracy": 0.0, "mean_step_score": 0.0,
                   "dropped_step_fraction": 0.0, "family/b/farm/steps_per_s": 3.0}  # a farm figure: not a trained one
            for f, (eps, steps, samples, secs) in per.items():
                row.update({f"family/{f}/episodes": eps, f"family/{f}/env_steps": steps, f"family/{f}/samples": samples,
                            f"family/{f}/rollout_s": secs})
            rows.append(row)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append({"arm": arm, "seed": seed, "out_dir": str(d)})
    spec = {"name": "m", "arms": {"mix": [], "single_a": []}, "family_comparisons": [["mix", "single_a", "a"]]}
    (tmp_path / "experiment.json").write_text(json.dumps({"spec": spec, "runs": runs}))
    r = compute_report(tmp_path)
    assert set(r["arms"]["single_a"]["family_throughput"]) == {"a"}  # b was evaluated only
    mix_a = r["arms"]["mix"]["family_throughput"]["a"]
    assert mix_a["steps_per_s"]["values"] == pytest.approx([10.0, 8.0])
    assert mix_a["episodes_per_iteration"]["mean"] == 8 and mix_a["rollout_s_per_iteration"]["mean"] == 4.5
    assert r["arms"]["mix"]["family_throughput"]["b"]["episodes_per_s"]["mean"] == pytest.approx(0.4)
    (c,) = r["family_comparisons"]
    assert c["throughput_ratio"]["values"] == pytest.approx([0.5, 0.5])  # 10 / 20 and 8 / 16 steps/s
    md = render_markdown(r)
    assert "### Per-family throughput (training rollouts)" in md and "| a | mix / single_a | 0.500" in md
    assert "| single_a | a | 8.000" in md


def test_the_collapse_check_also_counts_each_trained_family_of_a_mix(tmp_path):
    """A family can collapse inside a mix whose other family keeps the pooled malformed share low: the last
    iteration's malformed steps are also counted per family (runs that train more than one)."""
    d = tmp_path / "mix" / "seed1"
    d.mkdir(parents=True)
    rows = [{"kind": "eval", "iteration": it, "accuracy": 0.2, "family/a/accuracy": 0.2, "family/b/accuracy": 0.2}
            for it in (0, 1)]
    rows.append({"kind": "train", "iteration": 0, "accuracy": 0.0, "mean_step_score": 0.0,
                 "dropped_step_fraction": 0.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = [{"episode_id": f"it0-{f}-{i}", "family": f, "signals": {"parse_error": f == "b" and i < 2},
              "step_index": 0, "status": "ok"} for f, n in (("a", 8), ("b", 2)) for i in range(n)]
    (d / "trajectories.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    spec = {"name": "m", "arms": {"mix": []}, "collapse_malformed": 0.5}
    (tmp_path / "experiment.json").write_text(json.dumps({"spec": spec, "runs": [
        {"arm": "mix", "seed": 1, "out_dir": str(d)}]}))
    r = compute_report(tmp_path)
    run = r["runs"]["mix/seed1"]
    assert run["malformed_last"] == pytest.approx(0.2)  # pooled: below the threshold
    assert run["malformed_last_by_family"] == {"a": 0.0, "b": 1.0}
    assert run["collapse"] == ["100% of the last iteration's b steps were malformed"]
    md = render_markdown(r)
    assert "| mix | b | 1.000 (n=1) |" in md
