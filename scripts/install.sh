#!/usr/bin/env bash
# One command installs NextState and everything its tests use, system packages included, at the versions the suite
# passed with (scripts/constraints.txt: every direct and transitive dependency pinned; pyproject.toml keeps the ranges).
# Usage: scripts/install.sh            (as root, or with sudo available)
# Env:   NEXTSTATE_SKIP_APT=1 skips the system packages; PYTHON picks the interpreter (default: python3);
#        NEXTSTATE_TORCH_INDEX=<url> installs torch from that index (the CPU wheel's: https://download.pytorch.org/whl/cpu);
#        NEXTSTATE_RESOLVE=newest ignores the constraints and resolves the newest versions pyproject.toml allows
#        (what scripts/check_newest.sh does in a scratch environment);
#        NEXTSTATE_SKIP_IMAGES=1 skips building the sandbox root filesystems (the last step, minutes, needs root).
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
  gcc libc6-dev  # the hostile-agent probes' preload library (tests/test_task_dir_integrity.py)
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
# torch first, pinned. Where pip's find-links hold the CPU wheel (this project's machines: PIP_FIND_LINKS), that is the
# one it takes; from PyPI alone torch==2.13.0 is a multi-GB CUDA build, so NEXTSTATE_TORCH_INDEX names an index that
# serves the CPU wheel (https://download.pytorch.org/whl/cpu) where one is reachable.
TORCH_INDEX=()
if [ -n "${NEXTSTATE_TORCH_INDEX:-}" ]; then TORCH_INDEX=(--index-url "$NEXTSTATE_TORCH_INDEX"); fi
$PYTHON -m pip install -q "${TORCH_INDEX[@]}" "torch==2.13.0"
# every extra: CI tests them all. With the constraints, an already installed package at another version is replaced.
$PYTHON -m pip install -q "${PIN[@]}" -e ".[dev,docs,swe,docker,gui,serve,megatron,loggers]"
# the example plugin env (its own distribution), so `env=echo` resolves through the entry point
$PYTHON -m pip install -q "${PIN[@]}" -e examples/nextstate-echo-env
# OSWorld's own metric functions, the reference of tests/test_gui_app_metrics.py's differential checks: its package pins
# torch 2.5 and numpy < 2, so it comes without its dependencies (the tests load its metric files by path)
$PYTHON -m pip install -q --no-deps desktop-env==1.0.2 xmltodict==1.0.4  # xmltodict: its table, chrome and thunderbird metrics
# which torch build came (read once numpy is in: torch imported without it warns "Failed to initialize NumPy")
TORCH_BUILD=$($PYTHON -c "import torch; print(torch.__version__)")
case "$TORCH_BUILD" in
  *+cpu) ;;
  *) echo "note: torch $TORCH_BUILD is not the CPU build the suite's pins were measured with; for it, rerun with" \
          "NEXTSTATE_TORCH_INDEX=https://download.pytorch.org/whl/cpu (each run records its torch build)" >&2 ;;
esac
# The sandboxes' root filesystems, built once from Debian's packages (debootstrap, minutes) into the image cache, so
# that the first `python -m pytest` builds nothing: the sandbox image's and the desktop guest's roots, and the local
# desktop's root over the guest's. The docker images are imported from these when a test's engine lacks them.
if [ "${NEXTSTATE_SKIP_IMAGES:-0}" = "1" ]; then
  :
elif [ "$(id -u)" -eq 0 ]; then
  $PYTHON -m envs.runtime.images rootfs
  $PYTHON -m envs.runtime.guest_image rootfs
  $PYTHON -m envs.runtime.sandbox_root build
else
  echo "note: the sandbox roots need root to build (debootstrap): run 'sudo $PYTHON -m envs.runtime.sandbox_root build'" \
       "and the two 'rootfs' builds (envs.runtime.images, envs.runtime.guest_image); until then their tests skip" >&2
fi
echo "NextState installed. Run the tests with: python -m pytest (then the experiment tier: python -m pytest -m slow)"
