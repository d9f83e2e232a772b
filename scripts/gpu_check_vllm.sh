#!/usr/bin/env bash
# GPU check of backend=vllm, as one command on a machine with a CUDA GPU:
#   scripts/gpu_check_vllm.sh
# 1. installs the vllm extra unless `import vllm` already works: from wheels in .whl/ when that folder holds
#    any (a machine without a registry), else `pip install 'vllm>=0.8'`;
# 2. runs the vllm-marked tests (real engine, greedy agreement with Hugging Face);
# 3. runs benchmarks/vllm_vs_hf.py --engine vllm --smoke: builds the tiny model with head dim 64, saves it,
#    checks greedy outputs against the Hugging Face backend, prints samples/s of both, checks seeded sampling,
#    and runs the smoke suite through backend=vllm (reported as unavailable where Inspect is not installed).
# Sized for under 8 minutes on one H200 (eager engine, 64 prompts x 32 tokens). Logs go to $OUT (or /tmp).
# Runs from the source tree (PYTHONPATH), so only torch, transformers, tokenizers and vllm need be installed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp/gpu_check_vllm}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled INSPECT_DISPLAY=none
export STEER_HYDRA_CACHE=${STEER_HYDRA_CACHE:-/tmp/steer_hydra_cache}
status=0

echo "== device"
nvidia-smi -L || { echo "no NVIDIA GPU visible: this check needs one"; exit 2; }
"$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"

echo "== install the vllm extra"
if "$PY" -c "import vllm" 2>/dev/null; then
  echo "vllm already installed"
elif compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --find-links .whl vllm 2>&1 | tee "$LOGS/install.log" | tail -5
else
  "$PY" -m pip install -q "vllm>=0.8" 2>&1 | tee "$LOGS/install.log" | tail -5
fi
if ! "$PY" -c "import vllm; print('vllm', vllm.__version__)"; then
  echo "vllm could not be installed here; the engine checks cannot run (see $LOGS/install.log)."
  exit 3
fi

echo "== vllm-marked tests"
timeout 240 "$PY" -m pytest tests/backends -m vllm -q -p no:cacheprovider 2>&1 | tee "$LOGS/pytest.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== benchmark: backend=vllm vs huggingface"
timeout 300 "$PY" benchmarks/vllm_vs_hf.py --engine vllm --smoke --json "$LOGS/vllm_vs_hf.json" 2>&1 \
  | tee "$LOGS/benchmark.log" | grep -v -i -E "^(INFO|DEBUG)|it/s\]$" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== done (status $status); logs in $LOGS"
exit $status
