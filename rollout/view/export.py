"""The viewer's data: a run directory's JSONL files as small JavaScript files a static page loads from disk.

`data/run.js` holds what the first screen needs: the run's name and config, every metrics row (for the plots) and the
episode index (one column per field: id, split, iteration, task, family, status, outcome, steps, ...). The steps
themselves go to `data/steps/c<NNNNN>.js`, about `chunk_steps` steps each, an episode never split across two, and a
page loads the chunk of an episode only when it is opened: the first screen of a 100k-step run costs the index, not
the steps. Files are `NSV.run({...})` / `NSV.chunk(n, {...})` calls (JSONP), since a page opened from disk (file://)
may not fetch() JSON. The steps' screenshots stay where the run wrote them; the data says how to reach them from the
viewer's folder. Reading streams the files line by line (a torn last line, as a killed run leaves it, is skipped).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parent / "assets"
VIEWER_DIR = "viewer"
STEP_FILES = (("train", "trajectories.jsonl"), ("eval", "eval_trajectories.jsonl"))
#: the index's columns, in order (an episodes.jsonl field each, but `chunks`, `score` and `reward`)
INDEX_FIELDS = ("episode_id", "split", "iteration", "task_id", "family", "status", "outcome", "num_steps", "attempt",
                "group_id", "reason", "wall_s", "screenshot", "chunks", "score", "reward")
#: fields of a step the episode index already holds
STEP_DROP = ("run_id", "episode_id", "group_id", "task_id", "iteration", "prompt_ids", "output_ids", "output_logprobs")
REASON_CHARS = 300


@dataclass
class ViewerBuild:
    out_dir: Path
    episodes: int = 0
    steps: int = 0
    chunks: int = 0
    data_bytes: int = 0
    index_bytes: int = 0
    seconds: float = 0.0
    skipped_lines: dict[str, int] = field(default_factory=dict)


def read_lines(path: Path, skipped: dict[str, int]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one at a time; lines that do not parse are counted in `skipped`."""
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped[path.name] = skipped.get(path.name, 0) + 1
                continue
            if isinstance(row, dict):
                yield row


def _reason(text: Any) -> str:
    lines = [ln for ln in str(text or "").strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""  # a traceback's last line says what went wrong
    return last[:REASON_CHARS]


def _js(call: str, *args: Any) -> bytes:
    return f"{call}({', '.join(json.dumps(a, ensure_ascii=False, separators=(',', ':')) for a in args)});\n".encode()


class _Chunker:
    """Writes steps to chunk files of about `size` steps, cutting only between episodes."""

    def __init__(self, root: Path, size: int):
        self.root, self.size = root, max(1, size)
        self.index = 0
        self.steps: dict[str, list[dict[str, Any]]] = {}
        self.count = 0
        self.last: str | None = None
        self.bytes = 0

    def add(self, episode: str, step: dict[str, Any]) -> int:
        """Add a step; returns the chunk it goes to."""
        if episode != self.last and self.count >= self.size:
            self.flush()
        self.last = episode
        self.steps.setdefault(episode, []).append(step)
        self.count += 1
        return self.index

    def flush(self) -> None:
        if not self.steps:
            return
        data = _js("NSV.chunk", self.index, self.steps)
        (self.root / f"c{self.index:05d}.js").write_bytes(data)
        self.bytes += len(data)
        self.index += 1
        self.steps, self.count = {}, 0


def build_viewer(run_dir: str | Path, out_dir: str | Path | None = None, chunk_steps: int = 250) -> ViewerBuild:
    """Write the static viewer of `run_dir` to `out_dir` (default `<run_dir>/viewer/`); open its index.html."""
    t0 = time.perf_counter()
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "episodes.jsonl").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no metrics.jsonl or episodes.jsonl)")
    out = Path(out_dir) if out_dir else run_dir / VIEWER_DIR
    out.mkdir(parents=True, exist_ok=True)
    for asset in ASSETS.iterdir():
        shutil.copyfile(asset, out / asset.name)
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)  # a rebuild leaves no chunk of an earlier build
    (data / "steps").mkdir(parents=True)
    build = ViewerBuild(out)
    skipped = build.skipped_lines

    episodes: dict[str, dict[str, Any]] = {}
    for e in read_lines(run_dir / "episodes.jsonl", skipped):
        e["reason"] = _reason(e.get("reason"))
        e.update(chunks=[], score=None, reward=None)
        episodes[str(e.get("episode_id"))] = e
    chunker = _Chunker(data / "steps", chunk_steps)
    sums: dict[str, list[float]] = {}  # episode -> [judge score sum, judged steps, reward sum]
    for split, name in STEP_FILES:
        for s in read_lines(run_dir / name, skipped):
            ep = str(s.get("episode_id"))
            entry = episodes.get(ep)
            if entry is None:  # a step whose episode line is missing (cut by a kill): index it from the step
                entry = episodes[ep] = {"episode_id": ep, "split": split, "iteration": s.get("iteration"),
                                        "task_id": s.get("task_id"), "group_id": s.get("group_id"),
                                        "status": s.get("status"), "num_steps": 0, "chunks": [], "score": None,
                                        "reward": None, "reason": ""}
            chunk = chunker.add(ep, {k: v for k, v in s.items() if k not in STEP_DROP})
            if not entry["chunks"] or entry["chunks"][-1] != chunk:
                entry["chunks"].append(chunk)
            acc = sums.setdefault(ep, [0.0, 0, 0.0])
            judge = s.get("judge") or {}
            if judge.get("score") is not None:
                acc[0] += float(judge["score"])
                acc[1] += 1
            if s.get("reward") is not None:
                acc[2] += float(s["reward"])
            build.steps += 1
    chunker.flush()
    for ep, (score, judged, reward) in sums.items():
        episodes[ep]["score"] = round(score / judged, 4) if judged else None
        episodes[ep]["reward"] = round(reward, 4)

    metrics = list(read_lines(run_dir / "metrics.jsonl", skipped))
    config = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    state = json.loads((run_dir / "run_state.json").read_text()) if (run_dir / "run_state.json").exists() else None
    index = {f: [e.get(f) for e in episodes.values()] for f in INDEX_FIELDS}
    run = {
        "name": run_dir.resolve().name,
        "run_dir": str(run_dir.resolve()),
        "prefix": os.path.relpath(run_dir.resolve(), out.resolve()).replace(os.sep, "/") + "/",
        "config": config,
        "state": state,
        "metrics": metrics,
        "episodes": index,
        "counts": {"episodes": len(episodes), "steps": build.steps, "chunks": chunker.index},
        "skipped_lines": skipped,
        "built": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    payload = _js("NSV.run", run)
    (data / "run.js").write_bytes(payload)
    build.episodes, build.chunks = len(episodes), chunker.index
    build.index_bytes, build.data_bytes = len(payload), len(payload) + chunker.bytes
    build.seconds = time.perf_counter() - t0
    return build


__all__ = ["ASSETS", "VIEWER_DIR", "ViewerBuild", "build_viewer", "read_lines"]
