"""The report of an experiment (rollout/experiment/core.py), computed only from the files its runs wrote.

Inputs per run directory `<experiment>/<arm>/seed<k>/`: `metrics.jsonl` (eval rows: held-out greedy accuracy; train
rows: sampled accuracy, dropped buckets), `trajectories.jsonl` (per-step signals: malformed steps, step labels of the
SFT start), `warm_start.json` (the demonstrations' step labels), `config.yaml`; and at the top `experiment.json` (spec,
command) and `runs.jsonl` (wall times). `compute_report(dir)` returns every number as plain data (also written to
`report.json`); `write_report(dir)` renders `report.md` and `learning_curves.png` from it.

Statistics over seeds: mean, sample standard deviation, and a 95% t-interval (mean +- t_{0.975, n-1} sd / sqrt(n)).
Per-family throughput (env=mix): each trained family's training rollouts from the train rows'
`family/<family>/*` figures (episodes, env steps, samples, its rollout seconds), and for each
`experiment.family_comparisons` entry the paired ratio of the family's env steps per second in arm a to arm b.
Area under the learning curve: trapezoids over the evaluated iterations divided by their span (the curve's mean
accuracy). Paired differences take the same seed of both arms.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rollout.metrics import (
    FAMILY_PREFIX,
    area_under_curve,
    eval_curve,
    family_eval_curve,
    family_values,
    first_reaching,
    pick_tuned_value,
    tune_arm_name,
)
from rollout.records import read_jsonl
from rollout.stack import SoftwareStack

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
PLOT_PNG = "learning_curves.png"
NON_MISTAKES = ("ok", "propagated")


# ----- statistics (pure) -----
def summarize(values: Sequence[float]) -> dict[str, Any]:
    """mean, sd (n-1), n and the 95% t-interval [lo, hi] of `values` (no interval for n < 2)."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "lo": None, "hi": None, "values": []}
    mean = sum(vals) / n
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "lo": None, "hi": None, "values": vals}
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "lo": mean - half, "hi": mean + half, "values": vals}


# ----- reading one run -----
def run_dirs(exp_dir: Path) -> dict[str, dict[int, Path]]:
    """arm -> seed -> run directory, from experiment.json (falling back to the directory layout)."""
    info_path = exp_dir / "experiment.json"
    out: dict[str, dict[int, Path]] = defaultdict(dict)
    if info_path.exists():
        for r in json.loads(info_path.read_text())["runs"]:
            out[r["arm"]][int(r["seed"])] = Path(r["out_dir"])
    else:
        for d in sorted(exp_dir.glob("*/seed*")):
            out[d.parent.name][int(d.name[4:])] = d
    return dict(out)


def step_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "trajectories.jsonl"
    return read_jsonl(path) if path.exists() else []


def malformed_fraction(steps: list[dict[str, Any]], iteration: int, family: str | None = None) -> float | None:
    """Fraction of the steps of training iteration `iteration` (of one family's episodes, when given) whose action
    could not be parsed."""
    rows = [s for s in steps if s["episode_id"].startswith(f"it{iteration}-")
            and (family is None or s.get("family") == family)]
    if not rows:
        return None
    return sum(bool(s["signals"].get("parse_error")) for s in rows) / len(rows)


VERDICTS = {1: "right (+1)", 0: "consistent (0)", -1: "wrong (-1)"}


def gap_by_verdict(steps: list[dict[str, Any]], iteration: int) -> dict[str, float | None]:
    """The mean teacher-student gap (a hinted step's mean over its tokens, averaged over steps) of training iteration
    `iteration`'s hinted steps, by the sign of the judge's step score: where OPD pushes tokens up and where down."""
    by: dict[str, list[float]] = {v: [] for v in VERDICTS.values()}
    for s in steps:
        gap, judge = s.get("teacher_gap"), s.get("judge") or {}
        if gap and s["episode_id"].startswith(f"it{iteration}-") and judge.get("score") is not None:
            score = float(judge["score"])
            by[VERDICTS[(score > 0) - (score < 0)]].append(float(gap["mean"]))
    return {v: (sum(x) / len(x) if x else None) for v, x in by.items()}


def start_label_rates(steps: list[dict[str, Any]]) -> dict[int, Counter]:
    """Step index -> label counts of the steps sampled by the SFT start (weight version 0, training rollouts)."""
    counts: dict[int, Counter] = defaultdict(Counter)
    for s in steps:
        label = s["signals"].get("mistake")
        if s.get("weight_version") == 0 and label is not None and s.get("status") == "ok":
            counts[int(s["step_index"])][label] += 1
    return counts


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


RUN_SPECIFIC = ("run.", "experiment.")


def config_differences(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """key -> {name: value} for every config key whose value differs between the named configs (run.* and
    experiment.* left out: they name the run)."""
    flat = {name: flatten(c) for name, c in configs.items()}
    keys = sorted(set().union(*[set(f) for f in flat.values()])) if flat else []
    diffs = {}
    for k in keys:
        if k.startswith(RUN_SPECIFIC):
            continue
        vals = {name: f.get(k, "(absent)") for name, f in flat.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in vals.values()}) > 1:
            diffs[k] = vals
    return diffs


# ----- the report's numbers -----
def compute_report(exp_dir: str | Path) -> dict[str, Any]:
    """Every number of the report, as plain data: per run, per arm, the paired comparisons, the SFT starts, the
    configs."""
    exp_dir = Path(exp_dir)
    info = json.loads((exp_dir / "experiment.json").read_text()) if (exp_dir / "experiment.json").exists() else {}
    spec = info.get("spec", {})
    threshold = float(spec.get("threshold", 0.8))
    runs_meta = {(r["arm"], int(r["seed"])): r for r in (read_jsonl(exp_dir / "runs.jsonl")
                                                         if (exp_dir / "runs.jsonl").exists() else [])}
    dirs = run_dirs(exp_dir)
    per_run: dict[tuple[str, int], dict[str, Any]] = {}
    sft_groups: dict[str, dict[str, Any]] = {}
    for arm, seeds in dirs.items():
        for seed, d in sorted(seeds.items()):
            unfinished = bool(runs_meta) and (arm, seed) not in runs_meta  # stopped before it ended: left out
            if unfinished or not (d / "metrics.jsonl").exists():
                per_run[(arm, seed)] = {"missing": True, "dir": str(d)}
                continue
            metrics, steps = read_jsonl(d / "metrics.jsonl"), step_rows(d)
            per_run[(arm, seed)] = run_figures(d, metrics, steps, spec, threshold, runs_meta.get((arm, seed), {}))
            add_to_sft_group(sft_groups, d, f"{arm}/seed{seed}", metrics, steps)
    arms = {arm: arm_figures(arm, seeds, per_run, spec, threshold) for arm, seeds in dirs.items()}
    headline = spec.get("headline_iteration")
    between, within, first_config = config_sections(dirs)
    return {
        "first_config": first_config,
        "tune": tune_summary(info.get("tune")),
        "experiment": spec.get("name", exp_dir.name),
        "command": info.get("command"),
        "machine": info.get("machine", {}),
        "stack": info.get("stack"),
        "load_average_at_end": info.get("load_average_at_end"),
        "wall_s": info.get("wall_s"),
        "threshold": threshold,
        "headline_iteration": headline,
        "notes": spec.get("notes", ""),
        "collapse": {"drop": float(spec.get("collapse_drop", 0.2)),
                     "malformed": float(spec.get("collapse_malformed", 0.5))},
        "arms": arms,
        "comparisons": paired_comparisons(spec.get("comparisons", []), dirs, per_run, headline),
        "family_comparisons": paired_family_comparisons(spec.get("family_comparisons", []), dirs, per_run),
        "runs": {f"{a}/seed{s}": {k: v for k, v in r.items()
                                  if k not in ("curve", "train_curve", "step_score_curve", "family_curves")}
                 for (a, s), r in sorted(per_run.items())},
        "run_curves": {f"{a}/seed{s}": r.get("curve", []) for (a, s), r in sorted(per_run.items())},
        "sft_check": sft_check(sft_groups),
        "config_differences_between_arms": between,
        "config_differences_within_arms": within,
    }


def collapse_reasons(best: float | None, last: float | None, malformed_last: float | None,
                     malformed_by_family: dict[str, float | None], spec: dict[str, Any]) -> list[str]:
    """Why a run counts as collapsed (none: it did not): its held-out accuracy fell `collapse_drop` or more below its
    best, or more than `collapse_malformed` of its last iteration's steps (or of one trained family's) were
    malformed."""
    collapsed = []
    if best is not None and last is not None and best - last >= float(spec.get("collapse_drop", 0.2)):
        collapsed.append(f"held-out accuracy fell from its best {best:.3f} to {last:.3f}")
    if malformed_last is not None and malformed_last > float(spec.get("collapse_malformed", 0.5)):
        collapsed.append(f"{malformed_last:.0%} of the last iteration's steps were malformed")
    for f, x in malformed_by_family.items():
        if x is not None and x > float(spec.get("collapse_malformed", 0.5)):
            collapsed.append(f"{x:.0%} of the last iteration's {f} steps were malformed")
    return collapsed


def run_figures(d: Path, metrics: list[dict[str, Any]], steps: list[dict[str, Any]], spec: dict[str, Any],
                threshold: float, meta: dict[str, Any]) -> dict[str, Any]:
    """One finished run's figures, from its metrics rows and step records (`meta`: its runs.jsonl line)."""
    curve = eval_curve(metrics)
    train = [m for m in metrics if m.get("kind") == "train"]
    last_it = max((int(m["iteration"]) for m in train), default=None)
    buckets = sum(m.get("buckets", 0) for m in train)
    best = max((a for _, a in curve), default=None)
    last = curve[-1][1] if curve else None
    malformed_last = malformed_fraction(steps, last_it) if last_it is not None else None
    # env=mix: each trained family's own share (one family can collapse inside a mix the others keep up)
    trained = sorted({s["family"] for s in steps if s.get("family")}) if last_it is not None else []
    malformed_by_family = ({f: malformed_fraction(steps, last_it, f) for f in trained}
                           if len(trained) > 1 else {})
    return {
        "dir": str(d),
        "curve": curve,
        "family_curves": {f: family_eval_curve(metrics, f) for f in eval_families(metrics)},
        "family_throughput": family_throughput(metrics),
        "train_curve": [(int(m["iteration"]), float(m["accuracy"])) for m in train],
        "step_score_curve": [(int(m["iteration"]), float(m["mean_step_score"])) for m in train],
        "auc": area_under_curve(curve) if curve else None,
        "reach": first_reaching(curve, threshold) if curve else None,
        "dropped_bucket_fraction": sum(m.get("dropped_buckets", 0) for m in train) / buckets if buckets else None,
        "dropped_step_fraction": (sum(m["dropped_step_fraction"] for m in train) / len(train)) if train else None,
        "malformed_last": malformed_last,
        "malformed_last_by_family": malformed_by_family,
        "collapse": collapse_reasons(best, last, malformed_last, malformed_by_family, spec),
        "directive": directive_summary(train),
        "gap_by_verdict": ({"first": gap_by_verdict(steps, int(train[0]["iteration"])),
                            "last": gap_by_verdict(steps, last_it)}
                           if train and any(s.get("teacher_gap") for s in steps) else None),
        "wall_s": meta.get("wall_s"),
        "rc": meta.get("rc"),
    }


def add_to_sft_group(groups: dict[str, dict[str, Any]], d: Path, run: str, metrics: list[dict[str, Any]],
                     steps: list[dict[str, Any]]) -> None:
    """Count run `run` (directory `d`) under its SFT start (warm_start.json's key): the start's demonstration labels,
    the step labels it sampled, its accuracy at iteration 0. A run without a warm start adds nothing."""
    ws_path = d / "warm_start.json"
    if not ws_path.exists():
        return
    curve = eval_curve(metrics)
    train = [m for m in metrics if m.get("kind") == "train"]
    details = json.loads(ws_path.read_text()).get("_details", {})
    key = str(details.get("key", "?"))
    g = groups.setdefault(key, {"runs": [], "demo_labels": details.get("demonstration_labels", {}),
                                "stages": [s.get("name") for s in details.get("stages", [])],
                                "policy_counts": defaultdict(Counter), "eval0": [], "train0": []})
    g["runs"].append(run)
    for i, c in start_label_rates(steps).items():
        g["policy_counts"][i].update(c)
    if curve and curve[0][0] == 0:
        g["eval0"].append(curve[0][1])
    if train and int(train[0]["iteration"]) == 0:
        g["train0"].append(float(train[0]["accuracy"]))


def arm_figures(arm: str, seeds: dict[int, Path], per_run: dict[tuple[str, int], dict[str, Any]],
                spec: dict[str, Any], threshold: float) -> dict[str, Any]:
    """One arm's figures over its finished runs (`seeds`: every planned seed's directory)."""
    runs = [per_run[(arm, s)] for s in sorted(seeds) if not per_run[(arm, s)].get("missing")]
    its = sorted({it for r in runs for it, _ in r["curve"]})
    curve = {it: summarize([a for r in runs for i, a in r["curve"] if i == it]) for it in its}
    t_its = sorted({it for r in runs for it, _ in r["train_curve"]})
    train_curve = {it: summarize([a for r in runs for i, a in r["train_curve"] if i == it]) for it in t_its}
    reaches = [r["reach"] for r in runs]
    return {
        "seeds": [s for s in sorted(seeds) if not per_run[(arm, s)].get("missing")],  # finished runs
        "planned_seeds": sorted(seeds),
        "curve": curve,
        "train_curve": train_curve,
        "auc": summarize([r["auc"] for r in runs if r["auc"] is not None]),
        "reach": {"threshold": threshold, "per_seed": reaches, "reached": sum(r is not None for r in reaches),
                  "median": _median([r for r in reaches if r is not None])},
        "dropped_bucket_fraction": summarize([r["dropped_bucket_fraction"] for r in runs
                                              if r["dropped_bucket_fraction"] is not None]),
        "dropped_step_fraction": summarize([r["dropped_step_fraction"] for r in runs
                                            if r["dropped_step_fraction"] is not None]),
        "wall_s": summarize([r["wall_s"] for r in runs if r["wall_s"] is not None]),
        "overrides": spec.get("arms", {}).get(arm, []),
        "families": family_arm_figures(runs),
        "family_throughput": {fam: {k: summarize([r["family_throughput"][fam][k] for r in runs
                                                  if r["family_throughput"].get(fam, {}).get(k) is not None])
                                    for k in THROUGHPUT_KEYS}
                              for fam in dict.fromkeys(f for r in runs for f in r["family_throughput"])},
        "directive": {k: summarize([r["directive"][k] for r in runs
                                    if r.get("directive") and r["directive"].get(k) is not None])
                      for k in DIRECTIVE_KEYS} if any(r.get("directive") for r in runs) else None,
        "malformed_last": summarize([r["malformed_last"] for r in runs if r.get("malformed_last") is not None]),
        "malformed_last_by_family": {
            f: summarize([r["malformed_last_by_family"][f] for r in runs
                          if r["malformed_last_by_family"].get(f) is not None])
            for f in dict.fromkeys(f for r in runs for f in r["malformed_last_by_family"])},
        "directive_modes": _mode_shares(runs),
        "gap_by_verdict": {when: {v: summarize([r["gap_by_verdict"][when][v] for r in runs if r.get("gap_by_verdict")
                                                and r["gap_by_verdict"][when][v] is not None])
                                  for v in VERDICTS.values()} for when in ("first", "last")}
        if any(r.get("gap_by_verdict") for r in runs) else None,
    }


def paired_comparisons(pairs_of_arms: Sequence[Sequence[str]], dirs: dict[str, dict[int, Path]],
                       per_run: dict[tuple[str, int], dict[str, Any]], headline: int | None) -> list[dict[str, Any]]:
    """experiment.comparisons: for each (a, b), the same seed's area difference a − b (and at the headline
    iteration), with wins and ties."""
    comparisons = []
    for a, b in pairs_of_arms:
        if a not in dirs or b not in dirs:
            continue
        seeds = sorted(set(dirs[a]) & set(dirs[b]))
        pairs = [(per_run.get((a, s), {}), per_run.get((b, s), {})) for s in seeds]
        pairs = [(x, y) for x, y in pairs if x.get("auc") is not None and y.get("auc") is not None]
        diffs = [x["auc"] - y["auc"] for x, y in pairs]
        at = None
        if headline is not None:
            hd = [dict(x["curve"]).get(headline, math.nan) - dict(y["curve"]).get(headline, math.nan) for x, y in pairs]
            at = summarize([d for d in hd if not math.isnan(d)])
        comparisons.append({"a": a, "b": b, "auc_difference": summarize(diffs), "wins": sum(d > 0 for d in diffs),
                            "ties": sum(d == 0 for d in diffs), "pairs": len(diffs), "at_headline": at})
    return comparisons


def paired_family_comparisons(entries: Sequence[Sequence[str]], dirs: dict[str, dict[int, Path]],
                              per_run: dict[tuple[str, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """experiment.family_comparisons: for each (a, b, family), the same seed's differences on that family's held-out
    curve (area, last point, gain) and the paired ratio of its env steps per second."""
    out = []
    for a, b, fam in entries:
        if a not in dirs or b not in dirs:
            continue
        seeds = sorted(set(dirs[a]) & set(dirs[b]))
        pairs = [(per_run.get((a, s), {}).get("family_curves", {}).get(fam),
                  per_run.get((b, s), {}).get("family_curves", {}).get(fam)) for s in seeds]
        pairs = [(x, y) for x, y in pairs if x and y]
        out.append({
            "a": a, "b": b, "family": fam, "pairs": len(pairs),
            "auc_difference": summarize([area_under_curve(x) - area_under_curve(y) for x, y in pairs]),
            "last_difference": summarize([x[-1][1] - y[-1][1] for x, y in pairs]),
            "gain_difference": summarize([(x[-1][1] - x[0][1]) - (y[-1][1] - y[0][1]) for x, y in pairs]),
            "wins": sum(area_under_curve(x) > area_under_curve(y) for x, y in pairs),
            "throughput_ratio": summarize(paired_throughput_ratios(per_run, a, b, fam, seeds)),
        })
    return out


def sft_check(groups: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per SFT start: the step labels of its last stage's demonstrations against those its checkpoint sampled in the
    first training iteration, and its accuracy at the start."""
    sft = []
    for key, g in groups.items():
        demo = g["demo_labels"]
        last_stage = g["stages"][-1] if g["stages"] else "sft"
        demo_rates = {int(i): v for i, v in (demo.get(last_stage) or {}).items()}
        policy_rates = {i: {k: n / sum(c.values()) for k, n in sorted(c.items())}
                        for i, c in sorted(g["policy_counts"].items())}
        sft.append({"key": key, "runs": g["runs"], "stages": g["stages"], "demo_stage": last_stage,
                    "demo_rates": demo_rates, "policy_rates": policy_rates,
                    "policy_steps": {i: sum(c.values()) for i, c in g["policy_counts"].items()},
                    "eval_accuracy_at_start": summarize(g["eval0"]), "sampled_accuracy_at_start": summarize(g["train0"])})
    return sft


def config_sections(dirs: dict[str, dict[int, Path]]) -> tuple[dict[str, Any], dict[str, list[str]],
                                                               tuple[str, str] | None]:
    """(keys that differ between the arms' first runs, keys that differ between the seeds of each arm, the first
    run's name and config.yaml text)."""
    configs = {}
    for arm, seeds in dirs.items():
        first = seeds[min(seeds)] / "config.yaml"
        if first.exists():
            configs[arm] = yaml.safe_load(first.read_text())
    seed_configs = {}
    for arm, seeds in dirs.items():
        for seed, d in seeds.items():
            if (d / "config.yaml").exists():
                seed_configs[f"{arm}/seed{seed}"] = yaml.safe_load((d / "config.yaml").read_text())
    within_arm = {}
    for arm, seeds in dirs.items():
        sub = {k: v for k, v in seed_configs.items() if k.startswith(f"{arm}/")}
        within_arm[arm] = sorted(config_differences(sub))
    first_config = None
    for arm, seeds in dirs.items():
        path = seeds[min(seeds)] / "config.yaml"
        if path.exists():
            first_config = (f"{arm}/seed{min(seeds)}", path.read_text())
            break
    return config_differences(configs), within_arm, first_config


def eval_families(metrics: list[dict[str, Any]]) -> list[str]:
    """The families a run's eval rows report (`family/<family>/accuracy`), in the order they appear."""
    names: dict[str, None] = {}
    for m in metrics:
        if m.get("kind") == "eval":
            for k in m:
                if k.startswith(FAMILY_PREFIX) and k.endswith("/accuracy") and k.count("/") == 2:
                    names[k.split("/")[1]] = None
    return list(names)


def family_arm_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """family -> an arm's held-out figures of that family over its seeds: the curve, the first and last accuracy,
    the gain (last - first) and the area under the curve."""
    out: dict[str, Any] = {}
    for fam in dict.fromkeys(f for r in runs for f in r.get("family_curves", {})):
        curves = [r["family_curves"][fam] for r in runs if r.get("family_curves", {}).get(fam)]
        its = sorted({it for c in curves for it, _ in c})
        out[fam] = {
            "curve": {it: summarize([a for c in curves for i, a in c if i == it]) for it in its},
            "first": summarize([c[0][1] for c in curves]),
            "last": summarize([c[-1][1] for c in curves]),
            "gain": summarize([c[-1][1] - c[0][1] for c in curves]),
            "auc": summarize([area_under_curve(c) for c in curves]),
        }
    return out


#: a family's throughput figures of one run (family_throughput)
THROUGHPUT_KEYS = ("episodes_per_iteration", "samples_per_iteration", "rollout_s_per_iteration", "steps_per_s",
                   "episodes_per_s")


def family_throughput(metrics: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """family -> its training rollouts over a run, from the train rows' `family/<family>/*` figures (the families
    trained in the run; one a family has 0 weight in never has them): episodes, samples trained and rollout seconds
    per iteration (`rollout_s`: from the rollout's start to the family's last episode's end, its families side by
    side in a mix), and its env steps and episodes per second of those seconds."""
    sums: dict[str, Counter] = {}
    for m in metrics:
        if m.get("kind") != "train":
            continue
        for fam, v in family_values(m).items():
            if not v.get("episodes"):
                continue
            c = sums.setdefault(fam, Counter())
            for k in ("episodes", "env_steps", "samples", "rollout_s"):
                c[k] += float(v.get(k) or 0.0)
            c["iterations"] += 1
    out: dict[str, dict[str, float | None]] = {}
    for fam, c in sums.items():
        n, secs = c["iterations"], c["rollout_s"]
        out[fam] = {"episodes_per_iteration": c["episodes"] / n, "samples_per_iteration": c["samples"] / n,
                    "rollout_s_per_iteration": secs / n,
                    "steps_per_s": c["env_steps"] / secs if secs > 0 else None,
                    "episodes_per_s": c["episodes"] / secs if secs > 0 else None}
    return out


def paired_throughput_ratios(per_run: dict[tuple[str, int], dict[str, Any]], a: str, b: str, family: str,
                             seeds: Sequence[int]) -> list[float]:
    """Per seed both arms trained `family` in: its env steps per second in arm a / in arm b."""
    out = []
    for s in seeds:
        x = (per_run.get((a, s), {}).get("family_throughput") or {}).get(family, {}).get("steps_per_s")
        y = (per_run.get((b, s), {}).get("family_throughput") or {}).get(family, {}).get("steps_per_s")
        if x is not None and y:
            out.append(x / y)
    return out


#: a run's directive figures -> the metrics key each averages (rollout.metrics.directive_metrics; the distillation
#: term's from the trainer: train/backends/data_parallel.py, only in batches that distill)
DIRECTIVE_KEYS = {
    "hint_rate": "directive/hint_rate", "hint_rate_right": "directive/hint_rate_right",
    "hint_rate_wrong": "directive/hint_rate_wrong", "gap_mean": "directive/gap_mean", "gap_std": "directive/gap_std",
    "dropped_steps": "directive/dropped_steps", "teacher_s": "directive/teacher_s",
    "topk_sampled_mass": "directive/topk_sampled_mass", "entropy": "train/distill/entropy",
    "kl_mean": "train/distill/kl_mean",
}


def directive_summary(train: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run's directive-signal metrics (rollout.metrics.directive_metrics), each averaged over the training
    iterations that have it (None where none has), and its steps per advantage rule (summed); None for a run without
    them."""
    rows = [m for m in train if "directive/hint_rate" in m]
    if not rows:
        return None
    out: dict[str, Any] = {}
    for name, key in DIRECTIVE_KEYS.items():
        values = [float(m[key]) for m in rows if m.get(key) is not None]
        out[name] = sum(values) / len(values) if values else None
    modes: Counter = Counter()
    for m in rows:
        modes.update({k.removeprefix("directive/mode/"): int(v) for k, v in m.items() if k.startswith("directive/mode/")})
    out["modes"] = dict(modes)
    return out


def _mode_shares(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """The fraction of an arm's training steps under each advantage rule (all its runs together)."""
    counts: Counter = Counter()
    for r in runs:
        if r.get("directive"):
            counts.update(r["directive"]["modes"])
    total = sum(counts.values())
    return {k: n / total for k, n in sorted(counts.items())} if total else None


def tune_summary(tune: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tuning stage's sweep from its runs' metrics.jsonl: per value, the area under the held-out curve and the last
    held-out accuracy over the tuning seeds, and the value the driver's rule picks (recomputed, and the driver's)."""
    if not tune:
        return None
    spec = tune["spec"]
    key = spec["key"]
    values: dict[str, Any] = {}
    for value in spec["values"]:
        name = tune_arm_name(key, value)
        aucs, lasts, missing = [], [], []
        for r in tune["runs"]:
            if r["arm"] != name:
                continue
            path = Path(r["out_dir"]) / "metrics.jsonl"
            curve = eval_curve(read_jsonl(path)) if path.exists() else []
            if not curve:
                missing.append(int(r["seed"]))
                continue
            aucs.append(area_under_curve(curve))
            lasts.append(curve[-1][1])
        values[name] = {"value": value, "auc": summarize(aucs), "last": summarize(lasts), "missing_seeds": missing}
    best = pick_tuned_value(list(spec["values"]), [v["auc"]["mean"] for v in values.values()], spec.get("default"),
                            float(spec.get("min_gain") or 0.0))
    return {"arm": spec["arm"], "key": key, "seeds": spec["seeds"], "overrides": spec.get("overrides", []),
            "default": spec.get("default"), "min_gain": float(spec.get("min_gain") or 0.0),
            "values": values, "best": best, "chosen": tune.get("chosen")}


def _median(xs: Sequence[float]) -> float | None:
    s = sorted(xs)
    if not s:
        return None
    m = len(s) // 2
    return float(s[m]) if len(s) % 2 else (s[m - 1] + s[m]) / 2


# ----- rendering -----
def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _cell(s: dict[str, Any]) -> str:
    if not s or s.get("mean") is None:
        return "-"
    if s.get("sd") is None:
        return f"{s['mean']:.3f} (n=1)"
    return f"{s['mean']:.3f} ± {s['sd']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"


def render_markdown(r: dict[str, Any]) -> str:
    """report.md from `compute_report`'s data, section by section."""
    lines = [*render_header(r), *render_tune(r), *render_heldout(r), *render_comparisons(r), *render_families(r),
             *render_reach(r), *render_dropped(r), *render_directive(r), *render_collapse(r), *render_sft_check(r),
             *render_configs(r)]
    return "\n".join(lines) + "\n"


def render_header(r: dict[str, Any]) -> list[str]:
    """The title, the command, wall time and machine, the software stack and the experiment's notes."""
    lines = [f"# {r['experiment']}: report", ""]
    if r.get("command"):
        lines += ["Command:", "", "```bash", " ".join(r["command"]), "```", ""]
    m = r.get("machine", {})
    wall = r.get("wall_s")
    lines += [
        f"Wall time {_f(wall / 60 if wall else None, 1)} min for {len(r['runs'])} runs on {m.get('cpus', '?')} CPUs "
        f"(load average at start {m.get('load_average_at_start')}, at end {r.get('load_average_at_end')}). "
        "Every number below is computed from the run directories' files (`rollout/experiment/report.py`); "
        "intervals are 95% t-intervals over seeds.",
        "",
    ]
    if r.get("stack"):
        lines += [f"Software stack: {SoftwareStack(**r['stack']).line()}. The runs are deterministic on one stack and "
                  "machine; another stack or CPU moves the numbers (rollout/stack.py).", ""]
    if r.get("notes"):
        lines += [r["notes"].strip(), ""]
    return lines


def render_tune(r: dict[str, Any]) -> list[str]:
    """The tuning stage (experiment.tune): each swept value's area and last accuracy, and the one chosen."""
    t = r.get("tune")
    if not t:
        return []
    lines = [f"## Tuning: `{t['key']}` on the {t['arm']} arm (seeds {', '.join(map(str, t['seeds']))}, not used "
             "for evaluation)", "",
             "The value with the largest mean area under the held-out curve is set for every arm"
             + (f" (tuning runs also had `{' '.join(t['overrides'])}`)" if t["overrides"] else "")
             + (f", unless it beats the config's value ({t['default']}) by less than {t['min_gain']} in area: "
                "then the default is kept" if t.get("min_gain") else "") + ".", "",
             f"| {t['key']} | area under curve | last held-out accuracy | |", "|---|---|---|---|"]
    for name, v in t["values"].items():
        mark = "chosen" if v["value"] == t["chosen"] else ""
        lines.append(f"| {v['value']} | {_cell(v['auc'])} | {_cell(v['last'])} | {mark} |")
    if t["best"] != t["chosen"]:
        lines.append(f"\nWARNING: the recomputed best value {t['best']} is not the one the runs used ({t['chosen']}).")
    lines.append("")
    return lines


def render_heldout(r: dict[str, Any]) -> list[str]:
    """The held-out accuracy table (first, headline and last iteration, area), the learning curves and the plot."""
    arms = r["arms"]
    lines = ["## Held-out accuracy (greedy)", ""]
    its = sorted({int(it) for a in arms.values() for it in a["curve"]})
    head = r.get("headline_iteration")
    show = [its[0], *( [head] if head in its and head not in (its[0], its[-1]) else []), its[-1]] if its else []
    lines += ["| arm | seeds | " + " | ".join(f"iteration {i}" for i in show) + " | area under curve |",
              "|---|---|" + "---|" * len(show) + "---|"]
    for name, a in arms.items():
        cells = [_cell(a["curve"].get(i) or a["curve"].get(str(i), {})) for i in show]
        n = f"{len(a['seeds'])}" + (f" of {len(a['planned_seeds'])}" if len(a["seeds"]) < len(a["planned_seeds"]) else "")
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + f" | {_cell(a['auc'])} |")
    lines += ["", "### Learning curves (mean ± sd [95% interval] over seeds)", "",
              "| iteration | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for i in its:
        lines.append(f"| {i} | " + " | ".join(_cell(a["curve"].get(i, {})) for a in arms.values()) + " |")
    lines += ["", f"![learning curves]({PLOT_PNG})", ""]
    return lines


def render_comparisons(r: dict[str, Any]) -> list[str]:
    """The paired comparisons (experiment.comparisons): area difference, wins, at the headline iteration."""
    if not r["comparisons"]:
        return []
    head = r.get("headline_iteration")
    lines = ["## Paired comparisons (same seed, a − b)", "",
             "| a − b | area difference | wins | " + (f"at iteration {head} |" if head is not None else ""),
             "|---|---|---|" + ("---|" if head is not None else "")]
    for c in r["comparisons"]:
        row = f"| {c['a']} − {c['b']} | {_cell(c['auc_difference'])} | {c['wins']}/{c['pairs']} |"
        if head is not None:
            row += f" {_cell(c['at_headline'] or {})} |"
        lines.append(row)
    lines.append("")
    return lines


def render_reach(r: dict[str, Any]) -> list[str]:
    """Iterations to reach the threshold, per seed, per arm."""
    arms = r["arms"]
    lines = [f"## Iterations to reach {r['threshold']:g} held-out accuracy", "",
             "| arm | per seed | reached | median |", "|---|---|---|---|"]
    for name, a in arms.items():
        per = ", ".join("never" if x is None else str(x) for x in a["reach"]["per_seed"])
        lines.append(f"| {name} | {per} | {a['reach']['reached']}/{len(a['reach']['per_seed'])} | "
                     f"{_f(a['reach']['median'], 0)} |")
    return lines


def render_dropped(r: dict[str, Any]) -> list[str]:
    """Dropped buckets and groups, dropped steps and wall time per run, per arm."""
    arms = r["arms"]
    lines = ["", "## Dropped buckets and groups, wall time", "",
             "Dropped: zero-variance (task group, step) buckets (integrated) or task groups (outcome-only) get no "
             "gradient.", "",
             "| arm | dropped buckets/groups | dropped steps | wall time per run (s) |", "|---|---|---|---|"]
    for name, a in arms.items():
        lines.append(f"| {name} | {_cell(a['dropped_bucket_fraction'])} | {_cell(a['dropped_step_fraction'])} | "
                     f"{_cell(a['wall_s'])} |")
    return lines


def render_directive(r: dict[str, Any]) -> list[str]:
    """The directive signals of the arms that have them: hint rates, the teacher-student gap, dropped steps, the
    rules; the distribution-level arms' top-k figures; the gap by the judge's verdict."""
    arms = r["arms"]
    directive = {name: a for name, a in arms.items() if a.get("directive")}
    if not directive:
        return []
    lines = ["", "## Directive signals", "",
             "Per training iteration, averaged over the run's iterations, then over seeds: the fraction of judged "
             "steps with a hint (all; among steps scored +1; among steps scored -1), the teacher-student "
             "log-prob gap over the hinted steps' tokens (log pi_teacher - log pi_old: mean, and its spread "
             "over tokens), the fraction of steps with no gradient, and the seconds spent on the teacher's "
             "log-probs; then the share of the training steps under each advantage rule (train/opd.py).", "",
             "| arm | hint rate | hint rate, right steps | hint rate, wrong steps | mean gap | gap spread | "
             "dropped steps | teacher s / iteration | steps per rule |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, a in directive.items():
        d = a["directive"]
        rules = ", ".join(f"{k} {v:.0%}" for k, v in (a.get("directive_modes") or {}).items())
        lines.append(f"| {name} | {_cell(d['hint_rate'])} | {_cell(d['hint_rate_right'])} | "
                     f"{_cell(d['hint_rate_wrong'])} | {_cell(d['gap_mean'])} | {_cell(d['gap_std'])} | "
                     f"{_cell(d['dropped_steps'])} | {_cell(d['teacher_s'])} | {rules} |")
    distilled = {name: a["directive"] for name, a in directive.items() if _cell(a["directive"]["kl_mean"]) != "-"}
    if distilled:
        lines += ["", "The distribution-level arms (reward.opd_signal=teacher_topk), over their distilled tokens: "
                  "the hinted teacher's probability of the sampled token (0 where it is outside the teacher's "
                  "top-k), the student's entropy, and the divergence the term minimizes (reward.topk_divergence) "
                  "over the top-k + tail.", "",
                  "| arm | teacher's mass on the sampled token | student entropy | divergence |",
                  "|---|---|---|---|"]
        for name, d in distilled.items():
            lines.append(f"| {name} | {_cell(d['topk_sampled_mass'])} | {_cell(d['entropy'])} | "
                         f"{_cell(d['kl_mean'])} |")
    by_verdict = {name: a["gap_by_verdict"] for name, a in directive.items() if a.get("gap_by_verdict")}
    if by_verdict:
        lines += ["", "The mean gap of a hinted step (over its tokens, then over steps and seeds) by the judge's "
                  "step score, in the first and the last training iteration: > 0 where the hint makes the "
                  "sampled tokens more likely.", "",
                  "| arm | " + " | ".join(f"{v}, first | {v}, last" for v in VERDICTS.values()) + " |",
                  "|---|" + "---|---|" * len(VERDICTS)]
        for name, g in by_verdict.items():
            lines.append(f"| {name} | " + " | ".join(f"{_cell(g['first'][v])} | {_cell(g['last'][v])}"
                                                      for v in VERDICTS.values()) + " |")
    return lines


def render_collapse(r: dict[str, Any]) -> list[str]:
    """The collapse check per run, malformed steps per arm (and per family), failed or missing runs."""
    arms = r["arms"]
    collapsed = [(k, v["collapse"]) for k, v in r["runs"].items() if v.get("collapse")]
    failed = [k for k, v in r["runs"].items() if v.get("missing") or (v.get("rc") not in (0, None))]
    lines = ["", "## Collapse check", ""]
    drop, malformed = (r.get("collapse") or {}).get("drop", 0.2), (r.get("collapse") or {}).get("malformed", 0.5)
    lines.append(f"A run collapsed where its held-out accuracy ended {drop:g} or more below its best, or more than "
                 f"{malformed:.0%} of its last iteration's steps were malformed.")
    lines.append("No run collapsed." if not collapsed else "\n".join(f"- {k}: {'; '.join(v)}" for k, v in collapsed))
    lines += ["", "| arm | malformed steps, last iteration |", "|---|---|"]
    lines += [f"| {name} | {_cell(a.get('malformed_last') or {})} |" for name, a in arms.items()]
    by_family = [(name, f, st) for name, a in arms.items()
                 for f, st in (a.get("malformed_last_by_family") or {}).items()]
    if by_family:
        lines += ["", "Per family (runs that train more than one):", "",
                  "| arm | family | malformed steps, last iteration |", "|---|---|---|"]
        lines += [f"| {name} | {f} | {_cell(st)} |" for name, f, st in by_family]
    if failed:
        lines += ["", "Failed or missing runs: " + ", ".join(failed)]
    return lines


def render_sft_check(r: dict[str, Any]) -> list[str]:
    """The SFT starts: demonstration vs sampled step labels per step, accuracy at the start."""
    if not r["sft_check"]:
        return []
    lines = ["", "## The SFT start before RL", "",
             "Step labels of the demonstrations of the last SFT stage vs. those of the steps the SFT checkpoint "
             "sampled in the first training iteration (temperature 1, weight version 0), per step.", ""]
    for g in r["sft_check"]:
        lines += [f"Start `{g['key']}` (stages {', '.join(map(str, g['stages']))}; runs {', '.join(g['runs'])}): "
                  f"held-out greedy accuracy {_cell(g['eval_accuracy_at_start'])}, sampled accuracy of the first "
                  f"iteration {_cell(g['sampled_accuracy_at_start'])}.", ""]
        steps = sorted(set(g["demo_rates"]) | {int(i) for i in g["policy_rates"]})
        labels = sorted({lab for i in steps for lab in list(g["demo_rates"].get(i, {}))
                         + list(g["policy_rates"].get(i, {}))})
        if steps and labels:
            lines += ["| step | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
            for i in steps:
                d, p = g["demo_rates"].get(i, {}), g["policy_rates"].get(i, {})
                lines.append(f"| {i} | " + " | ".join(
                    f"{d.get(lab, 0):.0%} / {p.get(lab, 0):.0%}" for lab in labels) + " |")
            lines += ["", "(demonstrations / SFT checkpoint)", ""]
    return lines


def render_configs(r: dict[str, Any]) -> list[str]:
    """Each arm's overrides, the keys that differ between arms and between seeds, the first run's full config."""
    arms = r["arms"]
    lines = ["## Configs", ""]
    for name, a in arms.items():
        first = r["runs"].get(f"{name}/seed{(a['seeds'] or a['planned_seeds'])[0]}", {}).get("dir", "?")
        overrides = " ".join(a["overrides"]) or "(none)"
        lines.append(f"- `{name}`: overrides `{overrides}`; full config: `{first}/config.yaml`")
    diffs = r["config_differences_between_arms"]
    lines += ["", "Keys whose value differs between the arms (run.* and experiment.* aside):", ""]
    lines += [f"- `{k}`: " + ", ".join(f"{arm}={json.dumps(v, default=str)}" for arm, v in vals.items())
              for k, vals in diffs.items()] or ["- none"]
    within = {a: ks for a, ks in r["config_differences_within_arms"].items() if ks}
    lines += ["", "Keys that differ between the seeds of one arm: "
              + ("; ".join(f"{a}: {', '.join(ks)}" for a, ks in within.items()) if within else "none besides run.*.")]
    if r.get("first_config"):
        name, text = r["first_config"]
        lines += ["", f"<details><summary>The full config of {name} (the other runs differ only as listed above)"
                  "</summary>", "", "```yaml", text.rstrip(), "```", "", "</details>"]
    return lines


def render_families(r: dict[str, Any]) -> list[str]:
    """Per-family held-out accuracy of every arm (runs that report families: env=mix, and one-env runs), and the
    paired per-family comparisons (experiment.family_comparisons)."""
    arms = r["arms"]
    families = list(dict.fromkeys(f for a in arms.values() for f in a.get("families", {})))
    if len(families) < 2 and not r.get("family_comparisons"):
        return []
    lines = ["## Held-out accuracy per family (first -> last evaluation; area under the curve)", "",
             "| family | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for fam in families:
        cells = []
        for a in arms.values():
            f = a.get("families", {}).get(fam)
            cells.append("-" if not f else f"{_f(f['first']['mean'])} -> {_f(f['last']['mean'])} "
                                             f"(gain {_cell(f['gain'])}; area {_f(f['auc']['mean'])})")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    lines.append("")
    if r.get("family_comparisons"):
        lines += ["### Paired per-family comparisons (same seed, a − b)", "",
                  "| family | a − b | last accuracy difference | gain difference | area difference | wins |",
                  "|---|---|---|---|---|---|"]
        for c in r["family_comparisons"]:
            lines.append(f"| {c['family']} | {c['a']} − {c['b']} | {_cell(c['last_difference'])} | "
                         f"{_cell(c['gain_difference'])} | {_cell(c['auc_difference'])} | {c['wins']}/{c['pairs']} |")
        lines.append("")
    lines += render_family_throughput(r)
    return lines


def render_family_throughput(r: dict[str, Any]) -> list[str]:
    """Each trained family's training rollouts per arm, and the paired ratios of experiment.family_comparisons."""
    rows = [(name, fam, t) for name, a in r["arms"].items() for fam, t in (a.get("family_throughput") or {}).items()]
    if not rows:
        return []
    lines = ["### Per-family throughput (training rollouts)", "",
             "From each run's train rows (`family/<family>/*` in metrics.jsonl), per iteration then over seeds: the "
             "episodes and samples a family trained on, its rollout seconds (from the rollout's start to the "
             "family's last episode's end; in a mix the families roll out side by side on their own env slots), and "
             "its env steps and episodes per second of those seconds.", "",
             "| arm | family | episodes / iteration | samples trained / iteration | rollout s / iteration | "
             "env steps / s | episodes / s |", "|---|---|---|---|---|---|---|"]
    for name, fam, t in rows:
        lines.append(f"| {name} | {fam} | " + " | ".join(_cell(t.get(k) or {}) for k in THROUGHPUT_KEYS) + " |")
    ratios = [c for c in r.get("family_comparisons", []) if (c.get("throughput_ratio") or {}).get("n")]
    if ratios:
        lines += ["", "Paired (same seed): the family's env steps per second in arm a / in arm b (1.0: the other "
                  "families cost it nothing).", "", "| family | a / b | env steps / s ratio |", "|---|---|---|"]
        lines += [f"| {c['family']} | {c['a']} / {c['b']} | {_cell(c['throughput_ratio'])} |" for c in ratios]
    lines.append("")
    return lines


def standard_error_band(stats: dict[str, Any]) -> tuple[float, float]:
    """mean -/+ one standard error (sd / sqrt(n)) clipped to [0, 1]; just the mean for a single seed."""
    mean = stats["mean"]
    if not stats.get("sd") or stats["n"] < 2:
        return mean, mean
    se = stats["sd"] / math.sqrt(stats["n"])
    return max(0.0, mean - se), min(1.0, mean + se)


def paired_difference_curve(r: dict[str, Any], a: str, b: str) -> dict[int, list[float]]:
    """iteration -> held-out accuracy of arm `a` minus arm `b`, one value per seed both arms finished."""
    curves = r["run_curves"]
    out: dict[int, list[float]] = {}
    for key, points in curves.items():
        arm, seed = key.split("/")
        if arm != a or f"{b}/{seed}" not in curves:
            continue
        other = dict((int(i), v) for i, v in curves[f"{b}/{seed}"])
        for i, v in points:
            if int(i) in other:
                out.setdefault(int(i), []).append(v - other[int(i)])
    return dict(sorted(out.items()))


def plot(r: dict[str, Any], path: Path) -> None:
    """Three panels: held-out accuracy (each seed thin, the mean bold, a band of one standard error), the paired
    difference of the first comparison seed by seed, and the sampled training accuracy. The first comparison's two
    arms are drawn in full; the other arms (controls) as dashed means only, so the main comparison reads at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = tuple(r["comparisons"][0][k] for k in ("a", "b")) if r["comparisons"] else tuple(r["arms"])[:2]
    fig, (held, diff, train) = plt.subplots(1, 3, figsize=(15, 4.2), dpi=110)
    colors = {name: f"C{i}" for i, name in enumerate(r["arms"])}
    for name, arm in r["arms"].items():
        is_main = name in main
        for ax, key in ((held, "curve"), (train, "train_curve")):
            pts = sorted((int(i), st) for i, st in arm[key].items() if st.get("mean") is not None)
            if not pts:
                continue
            xs = [i for i, _ in pts]
            style = {"color": colors[name], "lw": 2.2 if is_main else 1.2, "ls": "-" if is_main else "--",
                     "marker": "o" if key == "curve" else None, "ms": 4}
            n = max(st["n"] for _, st in pts)
            ax.plot(xs, [st["mean"] for _, st in pts], label=f"{name} (n={n})", **style)
            if not is_main:
                continue
            bands = [standard_error_band(st) for _, st in pts]
            ax.fill_between(xs, [lo for lo, _ in bands], [hi for _, hi in bands], color=colors[name], alpha=0.18, lw=0)
            if key == "curve":
                for run, run_pts in r["run_curves"].items():
                    if run.split("/")[0] == name and run_pts:
                        ax.plot(*zip(*sorted(run_pts)), color=colors[name], lw=0.7, alpha=0.35)
    held.set_title("held-out accuracy (greedy): seeds thin, mean ± 1 s.e.")
    train.set_title("training accuracy (sampled): mean ± 1 s.e.")
    for ax in (held, train):
        ax.set_ylim(-0.02, 1.02)
    if len(main) == 2:
        by_it = paired_difference_curve(r, *main)
        if by_it:
            xs = list(by_it)
            seeds = min(len(v) for v in by_it.values())
            for k in range(seeds):
                diff.plot(xs, [by_it[i][k] for i in xs], color="0.5", lw=0.7, alpha=0.5)
            stats = [summarize(v) for v in by_it.values()]
            means = [st["mean"] for st in stats]
            se = [st["sd"] / math.sqrt(st["n"]) if st.get("sd") else 0.0 for st in stats]
            diff.plot(xs, means, color="k", lw=2.2, marker="o", ms=4, label=f"mean over {seeds} paired seeds")
            diff.fill_between(xs, [m - e for m, e in zip(means, se)], [m + e for m, e in zip(means, se)],
                              color="k", alpha=0.12, lw=0)
            diff.legend(fontsize=8, loc="upper left")
            reach = max(0.1, *(abs(v) for vals in by_it.values() for v in vals))
            diff.set_ylim(-min(1.02, reach * 1.15), min(1.02, reach * 1.15))  # symmetric: zero sits in the middle
        diff.axhline(0.0, color="k", lw=0.8)
        diff.set_title(f"held-out: {main[0]} − {main[1]}, per seed")
    for ax in (held, diff, train):
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    held.legend(fontsize=8, loc="upper left")
    fig.suptitle(r["experiment"])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(exp_dir: str | Path) -> Path:
    exp_dir = Path(exp_dir)
    data = compute_report(exp_dir)
    (exp_dir / REPORT_JSON).write_text(json.dumps(data, indent=2, default=str))
    plot(data, exp_dir / PLOT_PNG)
    out = exp_dir / REPORT_MD
    out.write_text(render_markdown(data))
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m rollout.experiment_report <experiment dir>`: (re)write the report from the directory's files (e.g. of
    an experiment that was stopped: unfinished runs are listed as missing)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m rollout.experiment_report", description=main.__doc__)
    ap.add_argument("exp_dir")
    args = ap.parse_args(argv)
    print(write_report(args.exp_dir))
    return 0


__all__ = ["area_under_curve", "compute_report", "first_reaching", "main", "render_markdown", "summarize", "write_report"]

if __name__ == "__main__":
    raise SystemExit(main())
