#!/usr/bin/env bash
# Resolve the newest versions pyproject.toml allows in a scratch virtual environment and run the whole suite (both
# tiers) against them: what a user who installs today gets. With --update-constraints, a green run rewrites
# scripts/constraints.txt from that environment (`pip freeze`), so the pins move only to versions the suite passed with.
# Usage: scripts/check_newest.sh [--update-constraints] [extra pytest args...]
# Env:   NEXTSTATE_SCRATCH_VENV=<dir> keeps the environment there (default: a temporary folder, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE=0
if [ "${1:-}" = "--update-constraints" ]; then UPDATE=1; shift; fi
VENV=${NEXTSTATE_SCRATCH_VENV:-}
if [ -z "$VENV" ]; then VENV=$(mktemp -d -t nextstate-newest-XXXXXX); trap 'rm -rf "$VENV"' EXIT; fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
PYTHON="$VENV/bin/python" NEXTSTATE_SKIP_APT=1 NEXTSTATE_RESOLVE=newest scripts/install.sh
# what the resolver picked, against the constraints (the lines that differ)
"$VENV/bin/python" -m pip freeze --exclude-editable | sort > "$VENV/newest.txt"
echo "newest versions that differ from scripts/constraints.txt:"
comm -13 <(grep -v '^#' scripts/constraints.txt | sort) "$VENV/newest.txt" | sed 's/^/  /' || true
"$VENV/bin/python" -m pytest "$@"
"$VENV/bin/python" -m pytest -m slow "$@"
if [ "$UPDATE" = 1 ]; then
  "$VENV/bin/python" scripts/write_constraints.py "$VENV/newest.txt"
  echo "scripts/constraints.txt updated from a green run; commit it with the fixes the run needed"
fi
