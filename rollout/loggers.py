"""Every metrics row also goes to TensorBoard and / or Weights & Biases: `run.loggers=[tensorboard, wandb]`.

A row of metrics.jsonl (`kind: train` or `kind: eval`) becomes scalars at step = its iteration, tagged
`<kind>/<key>` (`train/accuracy`, `eval/accuracy`, `train/loss` for the trainer's own `train/loss`, `train/judge/...`);
text and null values are left out. The run's resolved config goes along (TensorBoard: a `config` text summary; W&B:
the run's config). Extras: `pip install -e '.[loggers]'` (tensorboard, wandb).

- `tensorboard`: event files in `<run>/tensorboard/` (torch's SummaryWriter). A resumed run opens its writer with
  `purge_step` = the iteration it resumes at, so TensorBoard hides what the superseded attempt logged from there on.
- `wandb`: `run.wandb.*` (project, entity, group, tags, mode: online | offline | disabled, null: W&B's own setting,
  e.g. WANDB_MODE); files under `<run>/wandb/` unless `run.wandb.dir` says otherwise. The W&B run id is kept in
  run_state.json and a resumed run continues that W&B run (`resume="allow"`); every row carries `iteration` as W&B's
  x-axis, so rows of the iterations a resume redid appear twice in the W&B history (W&B cannot take steps back
  without its rewind feature), the later ones being those the run kept.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

LOGGERS = ("tensorboard", "wandb")
LOGGED_KINDS = ("train", "eval")
TENSORBOARD_DIR = "tensorboard"


@dataclass
class WandbOptions:
    """`run.wandb.*`: where a W&B run goes."""

    project: str = "nextstate"
    entity: str | None = None  # None: the logged-in user's default entity
    group: str | None = None  # e.g. an experiment's name, to compare its runs
    tags: list[str] = field(default_factory=list)
    mode: str | None = None  # online | offline | disabled; None: W&B's own setting (WANDB_MODE, `wandb login`)
    dir: str | None = None  # where W&B keeps its files; None: the run directory

    def __post_init__(self) -> None:
        if self.mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"run.wandb.mode={self.mode!r}: use online, offline, disabled or null (W&B's own setting)")


def check_loggers(names: Sequence[str]) -> list[str]:
    names = [str(n) for n in names]
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"run.loggers: unknown {unknown}; known: {', '.join(LOGGERS)} (e.g. run.loggers=[tensorboard])")
    return names


def scalars(row: Mapping[str, Any]) -> tuple[int, dict[str, float]] | None:
    """(step, tag -> value) of a metrics row; None for rows that are not logged (errors, resumes)."""
    kind = row.get("kind")
    step = row.get("iteration")
    if kind not in LOGGED_KINDS or not isinstance(step, int):
        return None
    out = {}
    for key, value in row.items():
        if key in ("kind", "iteration") or isinstance(value, str) or value is None:
            continue
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[key if key.startswith(f"{kind}/") else f"{kind}/{key}"] = float(value)
    return step, out


class MetricsLogger(Protocol):
    def log(self, row: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    def __init__(self, log_dir: Path, config_text: str, purge_step: int | None = None,
                 kept_rows: Sequence[Mapping[str, Any]] = ()):
        """`purge_step`: a resumed run's first iteration (TensorBoard hides every event from there on); `kept_rows`:
        the rows the resume kept, logged again when they sit at or after that step (the evaluation at it)."""
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (the loggers extra)
        except ImportError as exc:
            raise ImportError("run.loggers=[tensorboard] needs the tensorboard package: pip install -e '.[loggers]'"
                              ) from exc
        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)
        if not purge_step:  # a fresh run (or one resumed before its first iteration: step 0 was purged)
            self.writer.add_text("config", f"```yaml\n{config_text}\n```", 0)
        for row in kept_rows:
            if purge_step is not None and isinstance(row.get("iteration"), int) and row["iteration"] >= purge_step:
                self.log(row)

    def log(self, row: Mapping[str, Any]) -> None:
        found = scalars(row)
        if found is None:
            return
        step, values = found
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # one row per iteration: a killed run keeps what it logged

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, opts: WandbOptions, run_dir: Path, name: str, config: Mapping[str, Any], run_id: str | None):
        try:
            import wandb  # the loggers extra
        except ImportError as exc:
            raise ImportError("run.loggers=[wandb] needs the wandb package: pip install -e '.[loggers]'") from exc
        wandb_dir = Path(opts.dir) if opts.dir else run_dir
        wandb_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=opts.project, entity=opts.entity, group=opts.group, tags=list(opts.tags) or None, name=name,
            id=run_id, resume="allow", config=dict(config), dir=str(wandb_dir),
            mode=opts.mode,
        )
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        self.id = self.run.id

    def log(self, row: Mapping[str, Any]) -> None:
        found = scalars(row)
        if found is not None:
            step, values = found
            self.run.log({**values, "iteration": step})

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # finish() can return before W&B's service has written the run's files; this waits for it


class Loggers:
    """The configured loggers behind one `log(row)`; a logger that fails is reported once and dropped, never the run."""

    def __init__(self, loggers: Sequence[tuple[str, MetricsLogger]] = ()):
        self.loggers = list(loggers)

    def log(self, row: Mapping[str, Any]) -> None:
        for entry in list(self.loggers):
            name, logger = entry
            try:
                logger.log(row)
            except Exception as exc:
                log.error("logger %s failed (%s: %s); it gets no more rows", name, type(exc).__name__, exc)
                self.loggers.remove(entry)

    def close(self) -> None:
        for name, logger in self.loggers:
            try:
                logger.close()
            except Exception as exc:
                log.warning("closing logger %s failed: %s: %s", name, type(exc).__name__, exc)
        self.loggers = []


def make_loggers(names: Sequence[str], run_dir: Path, run_name: str, config: Mapping[str, Any], config_text: str,
                 wandb: WandbOptions, *, resume_at: int | None = None, kept_rows: Sequence[Mapping[str, Any]] = (),
                 wandb_id: str | None = None) -> tuple[Loggers, str | None]:
    """(the loggers `names` asks for, the W&B run id when W&B is one of them). `resume_at`: the iteration a resumed
    run starts at (TensorBoard purges later steps), `kept_rows` the metrics rows its resume kept."""
    built: list[tuple[str, MetricsLogger]] = []
    new_wandb_id = None
    for name in check_loggers(names):
        if name == "tensorboard":
            built.append((name, TensorBoardLogger(run_dir / TENSORBOARD_DIR, config_text, purge_step=resume_at,
                                                  kept_rows=kept_rows)))
        else:
            wb = WandbLogger(wandb, run_dir, run_name, config, wandb_id)
            new_wandb_id = wb.id
            built.append((name, wb))
    return Loggers(built), new_wandb_id


__all__ = ["LOGGERS", "Loggers", "MetricsLogger", "TensorBoardLogger", "WandbLogger", "WandbOptions", "check_loggers",
           "make_loggers", "scalars"]
