#!/usr/bin/env bash
# Build .gpu/whl here (not on the device): the wheels the GPU machine lacks for steer_hydra + Inspect, for
# CPython 3.12 manylinux x86_64 (~46 MiB). Run from anywhere: bash scripts/gpu/build_wheels.sh
# .gpu/ must stay out of git (add /.gpu/ to .git/info/exclude); copy .gpu/whl to the GPU machine with the tree.
#   .gpu/whl/*.whl      always installed: packages the machine lacks, and transformers (newer than the machine's)
#   .gpu/whl/opt/*.whl  fallbacks for packages the machine has at unknown versions (installed only when needed)
# Left out on purpose: numpy/tokenizers/safetensors/huggingface-hub/hf-xet/tiktoken (the machine's satisfy the
# requirements), debugpy (debugger only), s3fs/aiobotocore/aioitertools (s3:// logs only), httpx2/httpcore2/
# truststore (huggingface-hub 2.x only), wandb (imported lazily by steer_hydra's tracker; logger=none), and the
# inspect_ai sandbox-tool binaries (29 MB, docker sandboxes only: the wheel is repacked without them).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu && cd .gpu
work=$(mktemp -d)
python3 -m pip wheel -q --no-deps -w "$work/local" antlr4-python3-runtime==4.9.3
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --find-links "$work/local" -d "$work/all" \
  inspect-ai==0.3.285 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 nest-asyncio2==1.7.4 \
  transformers==5.24.0 sniffio
rm -rf whl && mkdir -p whl/opt
skip='^(numpy|tokenizers|safetensors|huggingface_hub|hf_xet|tiktoken|debugpy|s3fs|aiobotocore|aioitertools|httpx2|httpcore2|truststore|aiohttp|aiohappyeyeballs|aiosignal|frozenlist|multidict|propcache|yarl|wrapt|charset_normalizer|requests|typer|shellingham|annotated_doc)-'
opt='^(anyio|attrs|click|fsspec|markdown_it_py|mdurl|pygments|regex|rich|typing_extensions|zipp|packaging|h11|httpx|httpcore|tqdm|pyyaml|psutil|python_dateutil|six|certifi|idna|urllib3|filelock)-'
for w in "$work"/all/*.whl; do
  b=$(basename "$w")
  if [[ $b =~ $skip ]]; then continue; fi
  if [[ $b =~ $opt ]]; then cp "$w" whl/opt/; continue; fi
  if [[ $b == inspect_ai-* ]]; then python3 - "$w" "whl/$b" <<'EOF'
import sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
drop = lambda n: n.startswith("inspect_ai/binaries/") and not n.endswith(".py")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if drop(info.filename):
            continue
        data = zin.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = ("\n".join(l for l in data.decode().splitlines() if not drop(l.split(",")[0])) + "\n").encode()
        zout.writestr(info, data)
EOF
    continue
  fi
  cp "$w" whl/
done
rm -rf "$work"
du -sh whl whl/opt; ls whl | wc -l; ls whl/opt | wc -l
