#!/usr/bin/env bash
# One command for the GPU measurements (one H200-class GPU, at most ~7 minutes, no network needed). From the repo root:
#   OUT=<dir> bash scripts/gpu_check.sh
# Before: bash scripts/gpu/build_wheels.sh here (wheels the GPU machine lacks -> .gpu/whl, ~46 MiB, kept out of git
# through .git/info/exclude); copy .gpu/whl to the GPU machine with the working tree.
#   OUT=<dir>  results (log.txt env.txt pytest.txt overhead.json provider_default.txt provider_lean.txt realistic.txt
#              summary.txt)
#   PY=python3 the interpreter (torch must already be there)
#   SMOKE=1    CPU dry run: tiny shapes, few samples, device cpu, no wheel install (PY's env has the deps)
#   BUDGET_S   whole-run budget in seconds (default 400); each step's timeout is min(its cap, time left)
#   CAP_SCALE  multiplies every step's cap (default 1; e.g. 5 for a dry run on a slow, shared CPU)
# Steps: GPU-marked tests; steering overhead on a Llama-3.1-8B-shaped random model (unsteered, PASTA one layer / all
# layers, CAA; batch 1, 8, 32; 256-token prompts, 128 new tokens; bf16); provider vs raw vs Inspect hf/ on a
# Llama-3.2-1B-shaped model (default and lean logs); static vs refill on the long-tailed workload (1B shape).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-python3}
SMOKE=${SMOKE:-0}
OUT=${OUT:?set OUT to the results folder}
SITE=${SITE:-/tmp/site}
INSTALL=${INSTALL:-$([ "$SMOKE" = 1 ] && echo 0 || echo 1)}
BUDGET_S=${BUDGET_S:-400}
CAP_SCALE=${CAP_SCALE:-1}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
export INSPECT_DISPLAY=none INSPECT_LOG_LEVEL=error TOKENIZERS_PARALLELISM=false HF_HUB_DISABLE_TELEMETRY=1
export STEER_HYDRA_CACHE=/tmp/steer_hydra_cache
exec > >(tee -a "$OUT/log.txt") 2>&1
TEE_PID=$!

T0=$(date +%s)
say() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
# step NAME CAP[:MIN] OUTFILE CMD...: CMD under timeout min(CAP, budget left), tee'd to $OUT/OUTFILE; a failure
# does not stop the run; skipped when less than MIN seconds (default 20) of the budget are left
step() {
  local name=$1 cap=$(( ${2%%:*} * CAP_SCALE )) min=20 out=$3
  [[ $2 == *:* ]] && min=${2##*:}
  shift 3
  local left=$(( BUDGET_S - ($(date +%s) - T0) ))
  local limit=$(( cap < left ? cap : left ))
  if (( limit < min )); then
    say "SKIP $name: ${left}s of the budget left"; echo "$name: skipped (budget)" >> "$SUMMARY"; return
  fi
  say "START $name (timeout ${limit}s)"
  local start=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/$out"
  local rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - start ))
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && rc="$rc (timed out)"
  say "END $name rc=$rc in ${took}s"
  echo "$name: rc=$rc ${took}s" >> "$SUMMARY"
}

if [ "$SMOKE" = 1 ]; then
  DEVICE=cpu DTYPE=float32 SHAPE=smoke THREADS=1
  OVERHEAD_ARGS=${OVERHEAD_ARGS:---shape smoke --batches 1,4 --prompt-tokens 64 --new-tokens 8 --warmup-tokens 4 --repeats 2}
  PROVIDER_ARGS=${PROVIDER_ARGS:---samples 16 --batch 8 --max-tokens 8 --rounds 1 --serial-samples 4}
  REALISTIC_ARGS=${REALISTIC_ARGS:---samples 16 --batch 4 --max-tokens 32 --rounds 1 --skip-hf}
else
  DEVICE=cuda DTYPE=bfloat16 SHAPE=llama-3.2-1b THREADS=0
  OVERHEAD_ARGS=${OVERHEAD_ARGS:---shape llama-3.1-8b --batches 1,8,32 --prompt-tokens 256 --new-tokens 128 --warmup-tokens 16 --repeats 3}
  PROVIDER_ARGS=${PROVIDER_ARGS:---samples 256 --batch 32 --max-tokens 64 --rounds 2 --serial-samples 16 --hf-samples 64}
  REALISTIC_ARGS=${REALISTIC_ARGS:---samples 128 --batch 32 --max-tokens 256 --rounds 1 --skip-hf}
fi
say "steer_hydra GPU check: SMOKE=$SMOKE PY=$PY DEVICE=$DEVICE DTYPE=$DTYPE BUDGET_S=$BUDGET_S INSTALL=$INSTALL"

# 0. carried wheels, offline, into $SITE; PYTHONPATH puts them and the project ahead of the machine's packages
if [ "$INSTALL" = 1 ]; then
  rm -rf "$SITE"
  step install 90:30 env.txt env -u PYTHONPATH "$PY" scripts/gpu/install_wheels.py --site "$SITE" \
    --wheels "${WHEELS:-.gpu/whl}" --project .
  export PYTHONPATH="$SITE:$PWD"
else
  export PYTHONPATH="$PWD"
fi
say "PYTHONPATH=$PYTHONPATH"

# 0b. versions, imports, GPU
step env 60 env.txt "$PY" - <<'PYEOF'
import importlib.metadata as md, platform, sys, time
t = time.perf_counter()
print("python", sys.version.split()[0], platform.platform())
for name in ["torch", "transformers", "tokenizers", "accelerate", "inspect-ai", "hydra-core", "omegaconf", "anyio",
             "sniffio", "pydantic", "numpy", "pandas"]:
    try:
        print(f"  {name:<16} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name:<16} not installed")
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import steer_hydra, inspect_ai, transformers
from steer_hydra.evaluation import as_inspect_model
from steer_hydra.controls.state import CAA, PASTA
print("imports ok:", steer_hydra.__file__, f"{time.perf_counter() - t:.1f}s")
PYEOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
  --format=csv >> "$OUT/env.txt" 2>&1

# 1. GPU-marked tests: only the modules that hold some (collecting the whole tree costs a minute)
GPU_TESTS=$(grep -rl "pytest.mark.gpu" tests --include="test_*.py" | grep -v "^tests/app/" | tr '\n' ' ')
step pytest_gpu 90 pytest.txt "$PY" -m pytest $GPU_TESTS -m "gpu and not vllm" -q -p no:cacheprovider -rs -s

# 2. steering overhead through SteeringPipeline on a real-size random model
step overhead 140:60 overhead.txt "$PY" benchmarks/gpu/steering_overhead.py --device $DEVICE --dtype $DTYPE \
  $OVERHEAD_ARGS --budget-s 110 --out "$OUT/overhead.json"

# 3. provider vs raw vs hf/ (fixed length), default logs then lean logs; the provider as users get it (static
#    batching, max_connections = its max_connections()); refill through the provider is in step 4
step provider_default 80:40 provider_default.txt "$PY" benchmarks/gpu/on_device.py --shape $SHAPE --device $DEVICE \
  --dtype $DTYPE --benchmark provider_throughput -- $PROVIDER_ARGS --threads $THREADS
step provider_lean 50:30 provider_lean.txt "$PY" benchmarks/gpu/on_device.py --shape $SHAPE --device $DEVICE \
  --dtype $DTYPE --benchmark provider_throughput -- $PROVIDER_ARGS --threads $THREADS --lean-logs --rounds 1 --skip-hf

# 4. static vs refill on the long-tailed workload
step realistic 80:40 realistic.txt "$PY" benchmarks/gpu/on_device.py --shape $SHAPE --device $DEVICE --dtype $DTYPE \
  --benchmark realistic_throughput -- $REALISTIC_ARGS --modes raw-static,raw-refill,provider-static,provider-refill-x2

{
  echo "--- env"; grep -E "^(python|torch|imports ok|  unmet)" "$OUT/env.txt" 2>/dev/null
  echo "--- pytest"; grep -E "agreement|passed|skipped|failed|error" "$OUT/pytest.txt" 2>/dev/null | tail -6
  echo "--- overhead"; sed -n '/^STEERING OVERHEAD/,$p' "$OUT/overhead.txt" 2>/dev/null | head -20
  echo "--- provider (default logs)"; sed -n '/^mode /,$p' "$OUT/provider_default.txt" 2>/dev/null | head -14
  echo "--- provider (lean logs)"; sed -n '/^mode /,$p' "$OUT/provider_lean.txt" 2>/dev/null | head -14
  echo "--- realistic"; sed -n '/^output lengths/,$p' "$OUT/realistic.txt" 2>/dev/null | head -16
} >> "$SUMMARY"
rm -f "$OUT/overhead.txt"  # its table is in log.txt and summary.txt
say "done; summary:"
cat "$SUMMARY"
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
