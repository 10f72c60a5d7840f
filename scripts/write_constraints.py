"""Write scripts/constraints.txt from a `pip freeze` of an environment the whole suite passed in.

Usage: python scripts/write_constraints.py <freeze.txt>   (scripts/check_newest.sh --update-constraints calls it)
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

OWN = {"nextstate", "nextstate-echo-env"}  # the project's own distributions are installed editable, never pinned
HEADER = """\
# Every direct and transitive dependency of NextState (all extras) at the versions the whole suite passed with.
# scripts/install.sh and CI install with `pip install -c` this file; pyproject.toml keeps the ranges for library users.
# Written by scripts/write_constraints.py from a green `scripts/check_newest.sh --update-constraints` run ({when},
# Python {python}, {machine}). torch is the CPU wheel (installed first as torch==2.13.0).
"""


def constraints(freeze_lines: list[str]) -> list[str]:
    out = []
    for line in freeze_lines:
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or "==" not in line:
            continue
        name, version = line.split("==", 1)
        if name.lower().replace("_", "-") in OWN:
            continue
        out.append(f"{name}=={version.split('+', 1)[0]}")  # torch==2.13.0+cpu: the CPU build is install.sh's pin
    return sorted(out, key=str.lower)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    pins = constraints(Path(argv[0]).read_text().splitlines())
    header = HEADER.format(when=time.strftime("%Y-%m-%d"), python=platform.python_version(), machine=platform.machine())
    Path(__file__).with_name("constraints.txt").write_text(header + "\n".join(pins) + "\n")
    print(f"scripts/constraints.txt: {len(pins)} pins")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
