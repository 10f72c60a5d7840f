#!/usr/bin/env bash
# Resolve the newest versions pyproject.toml allows in a scratch virtual environment and run the whole suite (both
# tiers) against them: what a user who installs today gets. With --update-constraints, a green run rewrites
# scripts/constraints.txt from that environment (`pip freeze`), so the pins move only to versions the suite passed with.
# Usage: scripts/check_newest.sh [--update-constraints | --resolve-only] [extra pytest args...]
#        --resolve-only: install and list the versions that differ from the constraints, run nothing
# Env:   NEXTSTATE_SCRATCH_VENV=<dir> keeps the environment there (default: a temporary folder, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE=0 RESOLVE_ONLY=0
case "${1:-}" in
  --update-constraints) UPDATE=1; shift ;;
  --resolve-only) RESOLVE_ONLY=1; shift ;;
esac
VENV=${NEXTSTATE_SCRATCH_VENV:-}
if [ -z "$VENV" ]; then VENV=$(mktemp -d -t nextstate-newest-XXXXXX); trap 'rm -rf "$VENV"' EXIT; fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
PYTHON="$VENV/bin/python" NEXTSTATE_SKIP_APT=1 NEXTSTATE_RESOLVE=newest scripts/install.sh
# what the resolver picked, against the constraints (the lines that differ; torch's +cpu build tag is install.sh's)
"$VENV/bin/python" -m pip freeze --exclude-editable | sed 's/+[A-Za-z0-9.]*$//' | sort > "$VENV/newest.txt"
DIFFERENT=$(comm -13 <(grep -v -e '^#' -e '^$' scripts/constraints.txt | sort) "$VENV/newest.txt")
if [ -z "$DIFFERENT" ]; then
  echo "the newest versions are the constraints' versions"
else
  echo "newest versions that differ from scripts/constraints.txt:"; echo "$DIFFERENT" | sed 's/^/  /'
fi
if [ "$RESOLVE_ONLY" = 1 ]; then exit 0; fi
"$VENV/bin/python" -m pytest "$@"
"$VENV/bin/python" -m pytest -m slow "$@"
if [ "$UPDATE" = 1 ]; then
  "$VENV/bin/python" scripts/write_constraints.py "$VENV/newest.txt"
  echo "scripts/constraints.txt updated from a green run; commit it with the fixes the run needed"
fi
