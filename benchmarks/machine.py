"""The machine's state for a benchmark's JSON output: the development machine is shared, so every saved figure
carries the load it was measured under (`uptime` before and after the run)."""

from __future__ import annotations

import os
import subprocess
import time


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
