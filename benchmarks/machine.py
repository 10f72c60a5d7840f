"""The machine's state for a benchmark's JSON output: the development machine is shared, so every saved figure
carries the load it was measured under (`uptime` before and after the run)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path


def machine_state() -> dict[str, object]:
    """CPUs, load averages and the `uptime` line, now."""
    try:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        uptime = ""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "uptime": uptime,
    }


def save_report(report: dict[str, object], path: Path | None, *, echo: bool = True) -> None:
    """Print a benchmark's report as JSON (unless `echo` is off), and write it to `path` when one is given (its folder
    made)."""
    if echo:
        print(json.dumps(report, indent=1))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
