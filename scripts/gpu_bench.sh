#!/usr/bin/env bash
# GPU benchmarks, hacpo beside PyTorch eager on the same CUDA device, in one run that keeps to a
# time budget.
#
#   scripts/gpu_bench.sh --hacpo ./hacpo-cuda [--also ./hacpo-cuda-autotune] [--budget 540]
#                        [--python python3] [--shape qwen-1.5b] [--reps 2] [--out DIR]
#   scripts/gpu_bench.sh --device cpu --smoke --shape qwen-0.5b    # the script itself, on a CPU
#
# A CUDA machine may have no Rust toolchain: build the binary elsewhere and bring it along,
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda && strip target/release/hacpo
# (burn's autotuned kernels: --features cuda,burn/autotune; its fused kernels as well:
# --features cuda,burn/autotune,burn/fusion; pass such builds with --also to measure them beside
# the first) and have Python with torch and transformers here. CUDA_PATH defaults to
# /usr/local/cuda (hacpo's kernels are compiled by NVRTC at run time).
#
# What it runs (random weights in the shape of a zoo entry, no download), in this order, each
# stage under a time limit of its own and skipped when the budget has too little left:
#   0. the kernel cache: one step of the embedded default (`hacpo train --devices cuda --steps 1`,
#      held-out passes before and after) twice with an empty $HACPO_CACHE (DIR/hacpo-cache),
#      first compiling every kernel, then loading them from the cache (`kernel_cold`,
#      `kernel_warm`; --no-kernel-cache skips this; --smoke runs it on a CPU too). The stages
#      below share that cache.
#   1. for bf16, then f32: hacpo bench --device $DEVICE --random-shape SHAPE of every build
#      (bf16: prefill and decode read bf16 weights, the train step casts f32 master weights),
#      then scripts/bench_pytorch.py --device cuda --shape SHAPE (SDPA) in the same precision
#      (f32 with --tf32: burn's CUDA matmul rounds f32 operands to TF32, so PyTorch does too).
#      Same phases and sizes: prefill, decode at batches 1 and 64, train step. The
#      first build also runs prefill and decode with HACPO_GPU_KERNELS=off (column
#      NAME-burn-ops: burn's generic ops instead of hacpo's kernels, and in bf16 each product
#      widened to f32 and rounded back; --no-generic-ops skips it).
#   2. a whole GRPO step against TRL's GRPOTrainer (scripts/rl_step_bench.py --device cuda
#      --random-shape SHAPE --also-bf16: f32, and bf16 on both sides), when $PYTHON has trl and
#      datasets (pip install trl datasets); skipped otherwise, with that said.
#   3. hacpo bench --trainer --device cuda --compute-dtype bf16: HACPO steps of two random
#      agents with the real Qwen3 and Llama-3.1 tokenizers, of SHAPE's hidden size and depth;
#      reads tests/shared (and the fetched Llama tokenizer).
# Both benchmarks write each phase's figure to stderr as soon as it is measured, so a stage cut
# off by its limit still counts the phases it finished. The summary prints tokens/s side by side
# with the ratio hacpo / PyTorch and each run's peak memory (nvidia-smi, sampled every 0.2 s).
# Everything lands in DIR (default gpu-bench-<date>): each run's output (.out: JSON) and log (.err), and summary.txt.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HACPO="${HACPO:-$HERE/../target/release/hacpo}"
ALSO=()
PYTHON="${PYTHON:-python3}"
SHAPE="qwen-1.5b"
OUT="gpu-bench-$(date +%Y%m%d-%H%M%S)"
REPS=2
BUDGET=540
SIZES="--prefill-batch 4 --prefill-len 512 --prompt-len 128 --new-tokens 32 --train-batch 4 --train-len 512"
DEVICE="cuda"
TRAINER_STEPS=2
SMOKE=0
KERNEL_CACHE=1
GENERIC_OPS=1

usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hacpo) HACPO="$2"; shift 2 ;;
    --also) ALSO+=("$2"); shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --shape) SHAPE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --budget) BUDGET="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --no-kernel-cache) KERNEL_CACHE=0; shift ;;
    --no-generic-ops) GENERIC_OPS=0; shift ;;
    # Tiny sizes and one repetition: checks the script end to end, measures nothing useful.
    --smoke) SIZES="--prefill-batch 1 --prefill-len 16 --prompt-len 8 --new-tokens 2 --train-batch 1 --train-len 16"
             REPS=1; TRAINER_STEPS=1; SMOKE=1; shift ;;
    -h|--help) usage ;;
    *) echo "error: unknown argument $1" >&2; usage ;;
  esac
done

fail() { echo "error: $*" >&2; exit 2; }
for bin in "$HACPO" ${ALSO[@]+"${ALSO[@]}"}; do
  [ -x "$bin" ] || fail "no hacpo binary at $bin; build one with CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda and pass --hacpo PATH"
done
case "$BUDGET" in ''|*[!0-9]*) fail "--budget takes whole seconds, not $BUDGET" ;; esac
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
STARTED=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - STARTED) )); }

# Runs stage NAME for at most CAP seconds (less if the budget has less left; skipped under 45 s),
# its stdout to NAME.out and stderr to NAME.err, and records nvidia-smi's peak memory.
stage() {
  local name="$1" cap="$2"; shift 2
  local limit; limit=$(left); [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt 45 ]; then echo "== $name: skipped, $(left) s of the budget left" | tee -a "$OUT/stages.txt"; return; fi
  echo "== $name (at most $limit s)"
  local samples="$OUT/$name.memory" sampler="" rc=0 t0; t0=$(date +%s)
  : > "$samples"
  if [ "$DEVICE" != cpu ]; then
    ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >> "$samples"; sleep 0.2; done ) &
    sampler=$!
  fi
  timeout "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" || rc=$?
  [ -n "$sampler" ] && { kill "$sampler" 2> /dev/null; wait "$sampler" 2> /dev/null || true; }
  if [ -n "$sampler" ]; then sort -n "$samples" | tail -1; else echo "-"; fi > "$OUT/$name.peak_mib"
  local how="done"; [ "$rc" -eq 124 ] && how="cut off at its limit"; [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && how="failed (exit $rc)"
  echo "== $name: $how after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/stages.txt"
  grep -E '^(prefill|decode|train_step) b[0-9]+: ' "$OUT/$name.err" || true
  [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || tail -5 "$OUT/$name.err"
}

# Compiled kernels go to a cache of this run's own, empty at first (src/backend/kernel_cache.rs).
export HACPO_CACHE="$OUT/hacpo-cache"
rm -rf "$HACPO_CACHE" "$OUT/train-cold" "$OUT/train-warm"
if [ "$KERNEL_CACHE" = 1 ] && { [ "$DEVICE" != cpu ] || [ "$SMOKE" = 1 ]; }; then
  for run in cold warm; do
    stage "kernel_$run" 120 "$HACPO" train --devices "$DEVICE" --steps 1 --set task.val_every=0 --out "$OUT/train-$run"
  done
fi

LABELS=()
for bin in "$HACPO" ${ALSO[@]+"${ALSO[@]}"}; do LABELS+=("$(basename "$bin")"); done
[ "${#LABELS[@]}" -eq "$(printf '%s\n' "${LABELS[@]}" | sort -u | wc -l)" ] || fail "give the builds different file names: the summary names them by it"
BINS=("$HACPO" ${ALSO[@]+"${ALSO[@]}"})
[ "$GENERIC_OPS" = 1 ] && LABELS+=("${LABELS[0]}-burn-ops")
decode=1,64
for dtype in bf16 f32; do
  for i in "${!BINS[@]}"; do
    stage "${LABELS[$i]}_$dtype" 240 "${BINS[$i]}" bench --device "$DEVICE" --random-shape "$SHAPE" --compute-dtype "$dtype" \
      $SIZES --decode-batch "$decode" --reps "$REPS" --format json
  done
  if [ "$GENERIC_OPS" = 1 ]; then
    stage "${LABELS[0]}-burn-ops_$dtype" 150 env HACPO_GPU_KERNELS=off "$HACPO" bench --device "$DEVICE" --random-shape "$SHAPE" \
      --compute-dtype "$dtype" $SIZES --decode-batch "$decode" --reps "$REPS" --no-train --format json
  fi
  torch_dtype=bfloat16; [ "$dtype" = f32 ] && torch_dtype=float32
  # burn's CUDA matmul multiplies f32 in TF32: PyTorch likewise, or f32 would compare unlike work.
  tf32=(); [ "$dtype" = f32 ] && [ "$DEVICE" != cpu ] && tf32=(--tf32)
  stage "torch_$dtype" 150 "$PYTHON" "$HERE/bench_pytorch.py" --device "$DEVICE" --shape "$SHAPE" --dtype "$torch_dtype" \
    $SIZES --decode-batch "$decode" --reps "$REPS" ${tf32[@]+"${tf32[@]}"}
done

if "$PYTHON" -c "import trl, datasets" 2> /dev/null; then
  rl_layers=(); [ "$SMOKE" = 1 ] && rl_layers=(--layers 2)
  stage rl_step 240 "$PYTHON" "$HERE/rl_step_bench.py" --python "$PYTHON" --hacpo "$HACPO" --device "$DEVICE" \
    --random-shape "$SHAPE" ${rl_layers[@]+"${rl_layers[@]}"} --rounds 1 --steps 3 --also-bf16
else
  echo "== rl_step: skipped, $PYTHON has no trl or datasets (pip install trl datasets)" | tee -a "$OUT/stages.txt"
fi

read -r HIDDEN LAYERS < <("$PYTHON" -c "
import tomllib; c = tomllib.load(open('$HERE/../models/$SHAPE.toml', 'rb'))['config']
print(c['hidden_size'], c['num_hidden_layers'])")
[ "$SMOKE" = 1 ] && { HIDDEN=64; LAYERS=2; }
stage hacpo_trainer 150 "$HACPO" bench --trainer --device "$DEVICE" --compute-dtype bf16 --hidden "$HIDDEN" --layers "$LAYERS" \
  --steps "$TRAINER_STEPS"

"$PYTHON" - "$OUT" "${LABELS[@]}" <<'EOF' | tee "$OUT/summary.txt"
import os, re, sys
out, labels = sys.argv[1], sys.argv[2:]
line = re.compile(r"^(prefill|decode|train_step) b(\d+): ([\d.]+) tokens/s", re.M)
def rates(name):
    path = os.path.join(out, name + ".err")
    text = open(path).read() if os.path.exists(path) else ""
    return {(m[1], int(m[2])): float(m[3]) for m in line.finditer(text)}
def peak(name):
    path = os.path.join(out, name + ".peak_mib")
    return (open(path).read().strip() or "?") if os.path.exists(path) else "-"
print(f"GPU: {open(os.path.join(out, 'gpu.txt')).read().strip()}")
print("tokens/s (phases a stage finished); ratio = that hacpo build over PyTorch in the same precision")
for dtype in ["bf16", "f32"]:
    torch = rates(f"torch_{dtype}")
    runs = [(label, rates(f"{label}_{dtype}")) for label in labels]
    phases = sorted({k for _, r in runs for k in r} | set(torch), key=lambda k: (["prefill", "decode", "train_step"].index(k[0]), k[1]))
    head = "".join(f"{label[:22]:>24}{'ratio':>7}" for label, _ in runs)
    print(f"\n{dtype:<16}{head}{'PyTorch':>12}")
    for k in phases:
        cells = ""
        for _, r in runs:
            v, t = r.get(k), torch.get(k)
            cells += f"{'-' if v is None else round(v, 1)!s:>24}" + (f"{v / t:>7.2f}" if v and t else f"{'-':>7}")
        t = torch.get(k)
        print(f"{k[0] + ' b' + str(k[1]):<16}{cells}{'-' if t is None else round(t, 1)!s:>12}")
    print("peak MiB (nvidia-smi): " + ", ".join(f"{label} {peak(f'{label}_{dtype}')}" for label in labels)
          + f", PyTorch {peak(f'torch_{dtype}')}")
import json
for run in ["cold", "warm"]:
    path = os.path.join(out, f"train-{run}", "metrics.jsonl")
    if os.path.exists(path):
        first = json.loads(open(path).readline())["data"]
        print(f"\nkernel cache {run}: step 1 " + ", ".join(
            f"{k.split('/')[1]} {first[k]:.1f} s" for k in ["timing_s/step", "timing_s/gen", "timing_s/update_actor"] if k in first))
rl_step = os.path.join(out, "rl_step")
if os.path.exists(rl_step + ".err"):
    print("\nwhole GRPO step against TRL (rl_step_bench.py), each run as it ended, then the medians:")
    print("\n".join(l for l in open(rl_step + ".err").read().splitlines() if l.startswith("round ")))
    print(open(rl_step + ".out").read().strip() if os.path.exists(rl_step + ".out") else "")
trainer = os.path.join(out, "hacpo_trainer.out")
if os.path.exists(trainer):
    print("\nhacpo --trainer (last lines):")
    print("\n".join(open(trainer).read().strip().splitlines()[-8:]))
print("\n" + open(os.path.join(out, "stages.txt")).read().strip())
EOF
echo "results in $OUT/"
