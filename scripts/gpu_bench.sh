#!/usr/bin/env bash
# GPU benchmarks, hacpo beside PyTorch eager on the same CUDA device, in one run.
#
#   scripts/gpu_bench.sh --hacpo ./hacpo-cuda [--python python3] [--shape qwen-1.5b] [--out DIR]
#   scripts/gpu_bench.sh --device cpu --smoke --shape qwen-0.5b    # the script itself, on a CPU
#
# A CUDA machine may have no Rust toolchain: build the binary elsewhere and bring it along,
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda && strip target/release/hacpo
# and have Python with torch and transformers here. CUDA_PATH defaults to /usr/local/cuda
# (hacpo's kernels are compiled by NVRTC at run time).
#
# What it runs (random weights in the shape of a zoo entry, no download):
#   1. hacpo bench --device $DEVICE --random-shape SHAPE --compute-dtype f32, then bf16
#      (bf16: prefill and decode read bf16 weights, the train step casts f32 master weights)
#   2. scripts/bench_pytorch.py --device cuda --shape SHAPE     (SDPA; f32 and bf16)
#      Same phases and sizes: prefill, decode at batch 1 and 64, train step.
#   3. hacpo bench --trainer --device cuda --compute-dtype bf16: three HACPO steps of two random
#      agents with the real Qwen3 and Llama-3.1 tokenizers, both of SHAPE's hidden size and depth
#      (4 heads, MLP 3× hidden: the trainer bench's own family of shapes), on one GPU; reads tests/shared (and the fetched Llama tokenizer).
# and prints tokens/s side by side with the ratio hacpo / PyTorch, and each phase's peak memory
# (PyTorch's allocator peak; nvidia-smi's peak for hacpo, sampled every 0.2 s).
# Everything lands in DIR (default gpu-bench-<date>): the JSON of each run and summary.txt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HACPO="${HACPO:-$HERE/../target/release/hacpo}"
PYTHON="${PYTHON:-python3}"
SHAPE="qwen-1.5b"
OUT="gpu-bench-$(date +%Y%m%d-%H%M%S)"
REPS=5
PREFILL="--prefill-batch 4 --prefill-len 512"
DECODE="--decode-batch 1,64 --prompt-len 128 --new-tokens 128"
TRAIN="--train-batch 4 --train-len 512"
DEVICE="cuda"
TRAINER_STEPS=3
SMOKE=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hacpo) HACPO="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    # Tiny sizes and one repetition: checks the script end to end, measures nothing useful.
    --smoke) PREFILL="--prefill-batch 1 --prefill-len 16"; DECODE="--decode-batch 1,2 --prompt-len 8 --new-tokens 2"
             TRAIN="--train-batch 1 --train-len 16"; REPS=1; TRAINER_STEPS=1; SMOKE=1; shift ;;
    -h|--help) usage ;;
    *) echo "error: unknown argument $1" >&2; usage ;;
  esac
done

fail() { echo "error: $*" >&2; exit 2; }
[ -x "$HACPO" ] || fail "no hacpo binary at $HACPO; build one with CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda and pass --hacpo PATH"
if [ "$DEVICE" = cpu ]; then
  "$PYTHON" -c "import torch, transformers" || fail "$PYTHON needs torch and transformers"
else
  command -v nvidia-smi > /dev/null || fail "nvidia-smi not found: this script needs a CUDA machine (or --device cpu)"
  "$PYTHON" -c "import torch, transformers; assert torch.cuda.is_available(), 'torch sees no CUDA device'" \
    || fail "$PYTHON needs torch (with CUDA) and transformers: pip install torch transformers"
fi
[ -f "$HERE/../models/$SHAPE.toml" ] || fail "--shape $SHAPE: no zoo entry models/$SHAPE.toml"
export CUDA_PATH="${CUDA_PATH:-/usr/local/cuda}"
mkdir -p "$OUT"
if [ "$DEVICE" = cpu ]; then
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads" | tee "$OUT/gpu.txt"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi

# Peak GPU memory of a command, from nvidia-smi samples (hacpo has no allocator statistics).
with_peak() {
  local name="$1"; shift
  local samples="$OUT/$name.memory"
  : > "$samples"
  if [ "$DEVICE" = cpu ]; then
    "$@" || fail "$name failed: $*"
    echo "-" > "$OUT/$name.peak_mib"
    return
  fi
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >> "$samples"; sleep 0.2; done ) &
  local sampler=$!
  local rc=0
  "$@" || rc=$?
  kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null || true
  [ "$rc" -eq 0 ] || fail "$name failed (exit $rc): $*"
  sort -n "$samples" | tail -1 > "$OUT/$name.peak_mib"
}

for dtype in f32 bf16; do
  echo "== hacpo bench, $SHAPE shape, $dtype matmuls"
  with_peak "hacpo_$dtype" sh -c "\"$HACPO\" bench --device $DEVICE --random-shape $SHAPE --compute-dtype $dtype $PREFILL $DECODE $TRAIN --reps $REPS --format json > \"$OUT/hacpo_$dtype.json\""
done
for dtype in float32 bfloat16; do
  echo "== PyTorch eager (SDPA), $SHAPE shape, $dtype"
  "$PYTHON" "$HERE/bench_pytorch.py" --device "$DEVICE" --shape "$SHAPE" --dtype "$dtype" $PREFILL $DECODE $TRAIN \
    --reps "$REPS" > "$OUT/torch_$dtype.json" || fail "bench_pytorch.py --dtype $dtype failed"
done

echo "== hacpo: three HACPO steps of two random $SHAPE-shaped agents on one device ($DEVICE)"
read -r HIDDEN LAYERS < <("$PYTHON" -c "
import tomllib; c = tomllib.load(open('$HERE/../models/$SHAPE.toml', 'rb'))['config']
print(c['hidden_size'], c['num_hidden_layers'])")
[ "$SMOKE" = 1 ] && { HIDDEN=64; LAYERS=2; }
with_peak hacpo_trainer sh -c "\"$HACPO\" bench --trainer --device $DEVICE --compute-dtype bf16 --hidden $HIDDEN --layers $LAYERS --steps $TRAINER_STEPS > \"$OUT/hacpo_trainer.txt\" 2>&1"

"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
load = lambda f: json.load(open(os.path.join(out, f)))
h, h16 = load("hacpo_f32.json"), load("hacpo_bf16.json")
t32, t16 = load("torch_float32.json"), load("torch_bfloat16.json")
key = lambda r: (r["name"], r["batch"])
rate = lambda run: {key(r): r["tokens_per_second"] for r in run["results"]}
peak = lambda run: {key(r): r.get("peak_bytes") for r in run["results"]}
hr, hr16, r32, r16, p32, p16 = rate(h), rate(h16), rate(t32), rate(t16), peak(t32), peak(t16)
print(f"GPU: {open(os.path.join(out, 'gpu.txt')).read().strip()}")
print(f"model: {h['model']}; torch {t32['torch']}")
print("tokens/s; ratio = hacpo over PyTorch in the same precision")
print(f"{'phase':<16}{'hacpo f32':>11}{'torch f32':>11}{'ratio':>7}{'hacpo bf16':>12}{'torch bf16':>12}{'ratio':>7}"
      f"{'torch peak f32/bf16 GB':>25}")
for k in hr:
    gb = lambda p: "-" if p.get(k) is None else f"{p[k] / 1e9:.1f}"
    print(f"{k[0] + ' b' + str(k[1]):<16}{hr[k]:>11.1f}{r32[k]:>11.1f}{hr[k] / r32[k]:>7.2f}{hr16[k]:>12.1f}{r16[k]:>12.1f}"
          f"{hr16[k] / r16[k]:>7.2f}{gb(p32) + ' / ' + gb(p16):>25}")
for name in ["hacpo_f32", "hacpo_bf16", "hacpo_trainer"]:
    mib = open(os.path.join(out, name + ".peak_mib")).read().strip() or "?"
    print(f"{name}: peak GPU memory {mib} MiB (nvidia-smi)")
print("hacpo --trainer (last lines):")
print("\n".join(open(os.path.join(out, "hacpo_trainer.txt")).read().strip().splitlines()[-12:]))
EOF
echo "results in $OUT/"
