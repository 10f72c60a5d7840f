"""Progress bars (rich) for long phases and the end-of-run summary table."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


#: plain output (no terminal): a phase whose count has not moved prints its line again at most this often
PLAIN_QUIET_S = 30.0


class LiveProgress:
    """One bar per phase ("SFT", "eval @ iteration 0", "iteration 2/4" ...); `update(phase, done, total)` from anywhere
    on the event loop. Falls back to plain log lines when stderr is not a terminal (CI, files): a phase's start, each
    quarter, its end, and while its count stands still one line every PLAIN_QUIET_S (the loop refreshes the farm note
    every second)."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
            console=self.console,
            transient=False,
            disable=not sys.stderr.isatty(),
        )
        self.tasks: dict[str, Any] = {}
        self._last_plain: dict[str, int] = {}
        self._printed_at: dict[str, float] = {}

    def update(self, phase: str, done: int, total: int, note: str = "") -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.progress.add_task(phase, total=total, note=note)
        self.progress.update(self.tasks[phase], completed=done, total=total, note=note)
        if self.progress.disable:
            # plain output: start, every 25%, end; the same count again only after PLAIN_QUIET_S
            step = max(total // 4, 1)
            last = self._last_plain.get(phase)
            now = time.monotonic()
            if (last is None or done // step != last // step or (done == total and last != total)
                    or now - self._printed_at.get(phase, now) >= PLAIN_QUIET_S):
                self.console.print(f"{phase}: {done}/{total} {note}".rstrip(), soft_wrap=True)  # one line per update in logs
                self._printed_at[phase] = now
            self._last_plain[phase] = done

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()


def _fmt(x: float | None, pct: bool = False, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.{digits}f}"


def family_table(families: dict[str, dict[str, Any]]) -> Table:
    """The end-of-run figures of each family of an env=mix run (RunSummary.families)."""
    table = Table(title="per family (success and outcome: first -> last iteration; held-out: before -> after)")
    for col in ("family", "episodes", "success", "outcome", "step score", "steps", "steps/s", "aborted", "held-out"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for name, f in families.items():
        table.add_row(
            name, str(f["episodes"]),
            f"{_fmt(f['accuracy_first'], True)}->{_fmt(f['accuracy_last'], True)}",
            f"{_fmt(f['mean_outcome_first'], digits=2)}->{_fmt(f['mean_outcome_last'], digits=2)}",
            _fmt(f["mean_step_score"], digits=2), str(f["env_steps"]), f"{f['steps_per_s']:.1f}",
            f"{f['aborted']}" + (f"+{f['eval_aborted']}" if f.get("eval_aborted") else ""),
            f"{_fmt(f['eval_before'], True)}->{_fmt(f['eval_after'], True)}",
        )
    return table


def print_summary(summary: Any, out_dir: Path, warm_info: dict[str, Any] | None = None) -> None:
    console = Console(width=None if Console().is_terminal else 140)  # logs: wide enough for the per-family table
    table = Table(title=f"NextState run summary ({out_dir})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    if warm_info:
        for k, v in warm_info.items():
            if not k.startswith("_"):  # "_details" and the like go to files, not the console
                table.add_row(f"warm start: {k}", str(v))
    table.add_row("RL iterations", str(summary.iterations))
    table.add_row("mean outcome (first -> last iteration)",
                  f"{_fmt(summary.mean_outcome_first)} -> {_fmt(summary.mean_outcome_last)}")
    table.add_row("mean step score", _fmt(summary.mean_step_score))
    b, a = summary.eval_before, summary.eval_after
    table.add_row("eval accuracy (before -> after)",
                  f"{_fmt(b.accuracy if b else None, True)} -> {_fmt(a.accuracy if a else None, True)}"
                  + (f"  ({a.episodes} held-out tasks)" if a else ""))
    table.add_row("env steps", str(summary.env_steps))
    table.add_row("env steps/s (during rollouts)", f"{summary.steps_per_s:.1f}")
    table.add_row("aborted episodes (retried)", str(summary.aborted_episodes))
    prompts = getattr(summary, "prompts", None) or {}
    if prompts.get("policy/truncated_prompts"):  # the policy's log said so once; here is how often
        table.add_row("prompts cut to policy.max_prompt_tokens",
                      f"{prompts['policy/truncated_prompts']:,} (longest {prompts['policy/longest_prompt_tokens']:,} "
                      "tokens)")
    farm = getattr(summary, "farm", None) or {}
    if farm:
        table.add_row(
            "farm: restarts / timeouts / env errors",
            f"{farm.get('farm/restarts', 0)} / {farm.get('farm/timeouts', 0)} / {farm.get('farm/env_errors', 0)}",
        )
    if getattr(summary, "produced", 0):
        table.add_row(
            f"samples trained / produced (dropped stale; max_staleness {summary.max_staleness})",
            f"{summary.trained} / {summary.produced} ({summary.dropped_stale})",
        )
        table.add_row("rollout / train / overlapped time",
                      f"{summary.rollout_busy_s:.1f} / {summary.train_busy_s:.1f} / {summary.overlap_s:.1f} s")
    table.add_row("wall time", f"{summary.wall_s:.1f} s")
    console.print(table)
    families = getattr(summary, "families", None) or {}
    if len(families) > 1:
        console.print(family_table(families))
    extra = ", families.json" if len(families) > 1 else ""
    console.print(f"records: {out_dir}/trajectories.jsonl, episodes.jsonl, metrics.jsonl, config.yaml{extra}")
