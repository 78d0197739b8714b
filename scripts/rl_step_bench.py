#!/usr/bin/env python3
"""A whole GRPO step, hacpo against TRL's GRPOTrainer, on the same CPU, model and settings.

The step: SmolLM2-135M-Instruct (the GGUF of scripts/fetch-smollm2.sh, dequantised to f32 by both
sides), 4 GSM8K test questions x G = 8 samples, 128 new tokens at temperature 1 (no top-p, no
top-k), one optimizer update per step (TRL's num_iterations = 1), its gradient accumulated over
micro-batches of 8 sequences (TRL's per_device_train_batch_size = 8 with 4 accumulation steps,
hacpo's micro_batch_sequences = 8), no KL (TRL's
beta = 0, hacpo's kl_coef = 0), AdamW at lr 1e-6, reward 1 when the last number of the
completion is the answer. The prompt is hacpo's math prompt (the question, then "Please reason
step by step, ...") in the model's chat template on both sides.

Runs alternate, hacpo then TRL, --rounds times; each run trains --steps steps and its first step
(kernel and allocator warm-up, TRL's set-up) is left out. Printed: the median seconds per step of
each, hacpo's stages (generation, old log-probs, update) and the ratio. `--also-separate` adds a
hacpo run that scores the old log-probs in a pass of their own (algo.score_old_separately), as
every hacpo step did before the update's own pass gave them; `--also-hacpo BINARY` adds another
hacpo build (an earlier commit's, to measure a change); `--also-bf16` a hacpo run with its
products in bf16 (algo.compute_dtype); `--no-trl` leaves TRL out (no venv needed), the ratios
then against hacpo's f32 run.

On a GPU (`--device cuda`: hacpo's policy on cuda:0, TRL on the GPU it finds, `--also-bf16`
adds TRL with bf16 autocast beside hacpo's bf16 products) the model may instead be
`--random-shape ZOO_ID`: a Qwen-family zoo entry's shape (models/ZOO_ID.toml) with random weights
(seed 0) and the Qwen tokenizer of tests/shared, written once as a Hugging Face directory that
both sides load; `--layers N` keeps its first N layers (a quick check on a CPU). Random weights
earn no reward and sample every response to its full length, which times the same work on both
sides (neither skips a group whose rewards are all alike).

Usage:
  python3 scripts/rl_step_bench.py --python <venv with torch, transformers, trl, gguf, datasets> \\
      --hacpo target/release/hacpo --gguf "$(bash scripts/fetch-smollm2.sh)" [--rounds 2 --steps 3]
  python3 scripts/rl_step_bench.py --device cuda --random-shape qwen-0.5b --hacpo ./hacpo-cuda \\
      [--python python3] [--rounds 1 --steps 3 --also-bf16]
Threads: --threads (default: all cores) for both, as RAYON_NUM_THREADS and torch.set_num_threads.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GSM8K = os.path.join(HERE, "..", "tests", "shared", "data", "math", "gsm8k_test.jsonl")
MATH_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPTS, G, NEW_TOKENS, LR, MICRO = 4, 8, 128, 1e-6, 8


def questions():
    with open(GSM8K) as f:
        rows = [json.loads(line) for line in f][:PROMPTS]
    return [(r["question"].strip(), r["answer"].split("####")[-1].strip().replace(",", "")) for r in rows]


def hacpo_config(model, out, steps, separately, dtype="f32", device="cpu"):
    return f"""
[run]
out_dir = "{out}"
seed = 0
steps = {steps}
checkpoint_every = 0

[algo]
name = "grpo"
group_size = {G}
prompts_per_step = {PROMPTS}
minibatch_prompts = {PROMPTS}
micro_batch_sequences = {MICRO}
kl_coef = 0.0
{"score_old_separately = true" if separately else ""}
{f'compute_dtype = "{dtype}"' if dtype != "f32" else ""}

[algo.optimizer]
lr = {LR}

[rollout]
temperature = 1.0
top_p = 1.0
top_k = 0
max_new_tokens = {NEW_TOKENS}
max_prompt_tokens = 512
max_response_tokens = {NEW_TOKENS}
batch_prompts = {PROMPTS}

[task]
kind = "math"
train = "gsm8k={os.path.abspath(GSM8K)}"
train_limit = {PROMPTS}
val_every = 0

[[policies]]
name = "policy"
model = "{model}"
device = "{device}"
"""


def run_hacpo(args, separately, binary, dtype="f32"):
    """Seconds per step after the first, and the stages' seconds of each."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run")
        config = os.path.join(tmp, "config.toml")
        with open(config, "w") as f:
            f.write(hacpo_config(args.model, out, args.steps, separately, dtype, args.device))
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        subprocess.run([binary, "train", "--config", config, "--skip-memory-check"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line)["data"] for line in f]
    keys = {"step": "timing_s/step", "generation": "timing_s/gen", "old log-probs": "timing_s/old_log_prob",
            "update": "timing_s/update_actor"}
    return [{k: r[m] for k, m in keys.items()} for r in records[1:]]


def run_trl(args, bf16=False):
    worker = [args.python, os.path.abspath(__file__), "--trl-worker", "--model", args.model, "--steps", str(args.steps),
              "--threads", str(args.threads), "--device", args.device] + (["--trl-bf16"] if bf16 else [])
    done = subprocess.run(worker, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"TRL's run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    out = done.stdout
    return [{"step": s} for s in json.loads(out[out.rindex("{"):])["step_seconds"][1:]]


def load_trl_model(model_path, dtype):
    """The model as TRL fine-tunes it: a plain f32 model (one loaded from a GGUF is marked
    quantised, and the Trainer refuses to fine-tune it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not model_path.endswith(".gguf"):
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype), AutoTokenizer.from_pretrained(model_path)
    directory, name = os.path.split(model_path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    return model, tokenizer


def random_model(shape, layers, directory):
    """A Hugging Face directory of zoo entry SHAPE's architecture with random weights (seed 0) and
    the Qwen tokenizer of tests/shared; reused when it is there already."""
    import tomllib

    zoo = os.path.join(HERE, "..", "models", f"{shape}.toml")
    if not os.path.exists(zoo):
        sys.exit(f"--random-shape {shape}: no zoo entry {zoo}")
    entry = tomllib.load(open(zoo, "rb"))
    family = entry.get("family")
    if family not in ("qwen2", "qwen3"):
        sys.exit(f"--random-shape {shape}: a {family} shape needs its own tokenizer; use a qwen2 or qwen3 entry")
    if os.path.exists(os.path.join(directory, "model.safetensors")):
        return directory
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(entry["config"])
    if layers:
        values["num_hidden_layers"] = layers
    config = AutoConfig.for_model(family, **values, hidden_act="silu", eos_token_id=entry["eos_token_ids"][0],
                                  bos_token_id=None, use_cache=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Written beside and renamed: a run cut off while saving leaves nothing a later run reuses.
    parent = os.path.dirname(os.path.abspath(directory))
    partial = tempfile.mkdtemp(dir=parent, prefix=".partial-")
    model.save_pretrained(partial, safe_serialization=True)
    tokenizers = os.path.join(HERE, "..", "tests", "shared", "assets", "tokenizers", "qwen3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizers, name), partial)
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(partial, directory)
    return directory


def trl_worker(args):
    """Runs in the venv: TRL's GRPOTrainer, the same step; prints the seconds of each step."""
    import re

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    model, tokenizer = load_trl_model(args.model, torch.float32)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{q}\n{MATH_PROMPT}"}], "answer": a}
                              for q, a in questions()])

    def reward(completions, answer, **_):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        last = [re.findall(r"-?\d+(?:\.\d+)?", t.replace(",", "")) for t in texts]
        return [float(bool(n) and n[-1] == a) for n, a in zip(last, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.seconds, self.started = [], None

        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self.started)

    clock = Clock()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=args.device == "cpu", bf16=args.trl_bf16, fp16=False, seed=0, max_steps=args.steps,
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=PROMPTS * G // MICRO, num_generations=G,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1, report_to=[],
        save_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
        # TRL turns it on by default; hacpo's step keeps the activations, so neither recomputes.
        gradient_checkpointing=False)
    GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer,
                callbacks=[clock]).train()
    print(json.dumps({"step_seconds": clock.seconds, "torch": torch.__version__,
                      "trl": __import__("trl").__version__}))


def machine(device):
    """The CPU (model name, family and model numbers, the vector flags kernels pick by) and, on
    CUDA, the GPUs: figures from different machines are not comparable."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        text = ""
    first = text.split("\n\n")[0]
    fields = dict((k.strip(), v.strip()) for k, _, v in (l.partition(":") for l in first.splitlines()) if v)
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    # The same flags as hacpo bench's (src/bench/machine.rs, FLAGS), so the two name a CPU alike.
    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "asimd", "sve", "bf16",
              "i8mm"]
    cpu = fields.get("model name", os.uname().machine)
    if "cpu family" in fields:
        cpu += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    line = f"{cpu}, {os.cpu_count()} cores, {' '.join(f for f in wanted if f in flags)}"
    if device == "cuda":
        try:
            gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=30).stdout.strip()
            line += f"; GPU: {'; '.join(gpus.splitlines()) or 'nvidia-smi printed nothing'}"
        except (OSError, subprocess.SubprocessError):
            line += "; GPU: nvidia-smi not found"
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hacpo", default=os.path.join(HERE, "..", "target", "release", "hacpo"))
    ap.add_argument("--python", default="python3", help="a Python with torch, transformers, trl, gguf, datasets")
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-smollm2.sh)")
    ap.add_argument("--random-shape", metavar="ZOO_ID", help="a Qwen-family zoo entry's shape with random weights")
    ap.add_argument("--layers", type=int, help="with --random-shape: only this many layers")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides run (default cpu)")
    ap.add_argument("--trl-bf16", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="steps per run, the first left out (at least 2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--also-separate", action="store_true",
                    help="also time hacpo with the old log-probs scored in a pass of their own")
    ap.add_argument("--also-hacpo", action="append", default=[], metavar="BINARY",
                    help="also time this hacpo build (repeatable)")
    ap.add_argument("--also-bf16", action="store_true",
                    help="also time hacpo with its products in bf16 (algo.compute_dtype = \"bf16\")")
    ap.add_argument("--no-trl", action="store_true",
                    help="time hacpo only (no TRL venv needed); ratios against the f32 hacpo run")
    ap.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("--steps must be at least 2: the first step of each run is left out")
    if args.trl_worker:
        return trl_worker(args)
    if args.model_worker:
        return random_model(args.random_shape, args.layers, args.model)
    if bool(args.gguf) == bool(args.random_shape):
        sys.exit("give the model: --gguf FILE or --random-shape ZOO_ID")
    if args.gguf:
        args.model = os.path.abspath(args.gguf)
    else:
        name = args.random_shape + (f"-{args.layers}-layers" if args.layers else "")
        directory = os.path.join(tempfile.gettempdir(), f"rl-step-bench-{name}")
        make = [args.python, os.path.abspath(__file__), "--model-worker", "--random-shape", args.random_shape,
                "--model", directory] + (["--layers", str(args.layers)] if args.layers else [])
        subprocess.run(make, check=True)
        args.model = directory
        print(f"random model: {args.model}", file=sys.stderr, flush=True)
    # Who runs, and how: (hacpo binary, whether it asks for the old log-probs' own pass; a build
    # from before that setting has no such key; the compute dtype), None for TRL, "bf16" for TRL
    # under bf16 autocast.
    runs = {"hacpo": (args.hacpo, False, "f32")}
    if not args.no_trl:
        runs["trl"] = None
    if args.also_separate:
        runs["hacpo, separate old pass"] = (args.hacpo, True, "f32")
    if args.also_bf16:
        runs["hacpo, bf16 compute"] = (args.hacpo, False, "bf16")
        if args.device == "cuda" and not args.no_trl:
            runs["trl, bf16 autocast"] = "bf16"
    for binary in args.also_hacpo:
        runs[f"hacpo {binary}"] = (binary, False, "f32")
    steps = {who: [] for who in runs}
    for r in range(args.rounds):
        for who, how in runs.items():
            t = time.time()
            if how is None or how == "bf16":
                steps[who] += run_trl(args, bf16=how == "bf16")
            else:
                steps[who] += run_hacpo(args, how[1], how[0], how[2])
            timed = ", ".join(f"{s['step']:.1f}" for s in steps[who][-(args.steps - 1):])
            print(f"round {r + 1}: {who} {time.time() - t:.0f} s (s/step: {timed})", file=sys.stderr, flush=True)
    base = "hacpo" if args.no_trl else "trl"
    reference = statistics.median(s["step"] for s in steps[base])
    print(f"{'':<26} {'s/step':>8} {base.upper() if base == 'trl' else base:>5} / it   stages (median s)")
    for who, runs in steps.items():
        median = statistics.median(s["step"] for s in runs)
        stages = ", ".join(f"{k} {statistics.median(s[k] for s in runs):.1f}" for k in runs[0] if k != "step")
        print(f"{who:<26} {median:>8.1f} {reference / median:>8.2f}x   {stages}")
    where = "cuda" if args.device == "cuda" else f"{args.threads} threads"
    print(f"({sum(len(v) for v in steps.values())} steps timed, {where}, model {args.model})")
    print(f"machine: {machine(args.device)}")


if __name__ == "__main__":
    main()
