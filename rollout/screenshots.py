"""GUI screenshots kept on disk: each step's screen after its action (and each episode's first screen) as a PNG under
the run directory, referenced from the step's `screenshot` field in trajectories.jsonl (the viewer shows them).

`loop.save_screenshots` (on by default) turns it on; it only ever writes for envs whose observations carry an image
(the GUI family). Files go to `screenshots/a<attempt>/<episode>/step<t>.png` relative to the run directory, where the
attempt counts the run's resumes: a resumed run never overwrites a screenshot that a superseded record points at.
PNG encoding runs in a worker thread while the episode goes on; a screenshot that cannot be written is logged and left
out (the step's `screenshot` is null), never an episode failure. benchmarks/screenshots.py measures the cost.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SCREENSHOT_DIR = "screenshots"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")  # '#' (retries) would cut a URL short in the viewer


def write_png(image: Any, path: Path, compress_level: int = 1) -> int:
    """Write an HxWx3 uint8 image as a PNG (level 1: a desktop screen compresses well even so); returns its bytes."""
    from PIL import Image  # pillow: only for runs that save screenshots

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".png.tmp")
    Image.fromarray(np.asarray(image, dtype=np.uint8)).save(tmp, format="PNG", compress_level=compress_level)
    tmp.replace(path)  # a killed run leaves no half-written PNG under the name a record points at
    return path.stat().st_size


@dataclass
class ScreenshotWriter:
    run_dir: Path
    attempt: int = 0  # the run's resume count (0: its first start)
    compress_level: int = 1

    def relative_path(self, episode_id: str, name: str) -> str:
        return f"{SCREENSHOT_DIR}/a{self.attempt}/{_UNSAFE.sub('_', episode_id)}/{name}.png"

    def start(self, image: Any, episode_id: str, name: str) -> tuple[str, asyncio.Task[bool]] | None:
        """Begin writing `image` (None: nothing to write); returns (its path relative to the run dir, the task that
        writes it, which says whether it worked)."""
        if image is None:
            return None
        rel = self.relative_path(episode_id, name)
        return rel, asyncio.ensure_future(self._write(image, rel))

    async def _write(self, image: Any, rel: str) -> bool:
        try:
            await asyncio.to_thread(write_png, image, self.run_dir / rel, self.compress_level)
            return True
        except Exception as exc:  # disk full, an odd image: the record says no screenshot, the episode goes on
            log.warning("could not save the screenshot %s: %s: %s", rel, type(exc).__name__, exc)
            return False


__all__ = ["SCREENSHOT_DIR", "ScreenshotWriter", "write_png"]
