#!/usr/bin/env bash
# One command installs NextState and everything its tests use, system packages included, at the versions the suite
# passed with (scripts/constraints.txt: every direct and transitive dependency pinned; pyproject.toml keeps the ranges).
# Usage: scripts/install.sh            (as root, or with sudo available)
# Env:   NEXTSTATE_SKIP_APT=1 skips the system packages; PYTHON picks the interpreter (default: python3);
#        NEXTSTATE_RESOLVE=newest ignores the constraints and resolves the newest versions pyproject.toml allows
#        (what scripts/check_newest.sh does in a scratch environment).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

APT_PACKAGES=(
  git            # swe: repositories and worktrees
  bubblewrap     # terminal / swe: the local sandbox
  debootstrap    # docker: build test images locally (no registry is reachable)
  docker.io      # docker backend (engine started privately by envs.runtime.dockerd)
  xvfb xdotool x11-utils wmctrl scrot   # gui: virtual displays and window tools
  dbus dbus-x11 at-spi2-core python3-gi gir1.2-atspi-2.0 gir1.2-gtk-3.0  # gui: accessibility tree
  xterm openbox sudo python3-tk   # gui: bundled tasks' terminal, optional window manager, OSWorld's sudo; Tk apps
  chromium       # the run viewer's tests (headless, driven by playwright; playwright downloads no browser of its own)
)

if [ "${NEXTSTATE_SKIP_APT:-0}" != "1" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"
fi

PIN=(-c scripts/constraints.txt)
case "${NEXTSTATE_RESOLVE:-locked}" in
  locked) ;;
  newest) PIN=() ;;
  *) echo "NEXTSTATE_RESOLVE must be 'locked' or 'newest', not '${NEXTSTATE_RESOLVE}'" >&2; exit 2 ;;
esac
# torch first, pinned: the CPU wheel. A bare `torch` requirement would pull a multi-GB CUDA build.
$PYTHON -m pip install -q "torch==2.13.0"
# every extra: CI tests them all. With the constraints, an already installed package at another version is replaced.
$PYTHON -m pip install -q "${PIN[@]}" -e ".[dev,docs,swe,docker,gui,serve,megatron,loggers]"
# the example plugin env (its own distribution), so `env=echo` resolves through the entry point
$PYTHON -m pip install -q "${PIN[@]}" -e examples/nextstate-echo-env
echo "NextState installed. Run the tests with: python -m pytest (then the experiment tier: python -m pytest -m slow)"
