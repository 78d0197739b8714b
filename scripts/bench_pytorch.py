#!/usr/bin/env python3
"""The PyTorch (eager, transformers) counterpart of `hacpo bench`, for side-by-side figures.

Same models, sizes and definitions as src/bench.rs:
  prefill     forward of [batch, len] random ids, last-position logits only (logits_to_keep=1)
  decode      greedy tokens/s with the KV cache, prefill excluded: (t(1+new) - t(1)) / (batch*new)
  train_step  forward + backward (mean token NLL) + AdamW(lr 1e-4, eps 1e-8, wd 0.01)
Threads: torch.set_num_threads(--threads), default all cores, as hacpo's rayon pool.
Each measurement runs once to warm up, then --reps times; the median rate is reported.

On CUDA every timed region ends with torch.cuda.synchronize(), and the peak allocated memory of
each phase is reported (peak_bytes). float32 products are full precision there unless --tf32.

Usage:
  python scripts/bench_pytorch.py                       # tiny-5m, random weights
  python scripts/bench_pytorch.py --gguf "$(bash scripts/fetch-smollm2.sh)"
  python scripts/bench_pytorch.py --shape qwen-1.5b --device cuda --dtype bfloat16   # as scripts/gpu_bench.sh
Needs: torch, transformers (and accelerate + gguf for --gguf).
"""
import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = "cpu"


def sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def zoo_shape(zoo_id):
    """A random model in the shape of hacpo's zoo entry models/<zoo_id>.toml ([config] table)."""
    import tomllib
    with open(os.path.join(HERE, "..", "models", f"{zoo_id}.toml"), "rb") as f:
        entry = tomllib.load(f)
    c = dict(entry["config"])
    family = entry["family"]
    rope = {"rope_type": "default", "rope_theta": c.pop("rope_theta", 10000.0)}
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**c, rope_parameters=rope))
    if family == "llama":
        scaling = c.pop("rope_scaling", None)
        if scaling:
            rope = {**scaling, "rope_theta": rope["rope_theta"]}
        return LlamaForCausalLM(LlamaConfig(**c, rope_parameters=rope))
    raise SystemExit(f"--shape {zoo_id}: family {family} is not wired here (qwen2 and llama are)")


def tiny_5m():
    cfg = LlamaConfig(vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return LlamaForCausalLM(cfg)


def timed(fn):
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def median_rate(run, reps):
    """run() -> (tokens, seconds); one warm-up, then the median of `reps` rates."""
    run()
    samples = sorted((run() for _ in range(reps)), key=lambda s: s[0] / s[1])
    return samples[len(samples) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill-batch", type=int, default=4)
    ap.add_argument("--prefill-len", type=int, default=256)
    ap.add_argument("--decode-batch", default="1,64")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--shape", help="a hacpo zoo id: random weights in that model's shape")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tf32", action="store_true",
                    help="float32 products in TF32 on CUDA (allow_tf32), as burn's CUDA matmul runs them")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    # PyTorch multiplies float32 in full precision unless told otherwise; hacpo's CUDA build (burn's
    # matmul) rounds float32 operands to TF32 for the tensor cores: --tf32 compares like with like.
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.shape:
        model = zoo_shape(args.shape)
        name = f"{args.shape} shape (random)"
    elif args.gguf:
        d, f = os.path.dirname(args.gguf), os.path.basename(args.gguf)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation=args.attn)
        name = f
    else:
        model = tiny_5m()
        name = "tiny-5m (random)"
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype))
    model.eval()
    vocab = model.config.vocab_size
    results = []
    peaks = []

    def phase_done():
        # Each figure as soon as it is measured (as `hacpo bench` does): a run stopped by a
        # time limit still leaves the phases it finished on stderr.
        n, b, k, s = results[-1]
        print(f"{n} b{b}: {k / s:.1f} tokens/s (median of {args.reps})", file=sys.stderr, flush=True)
        if DEVICE.startswith("cuda"):
            peaks.append(torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()
        else:
            peaks.append(None)

    with torch.no_grad():
        def prefill():
            ids = torch.randint(0, vocab, (args.prefill_batch, args.prefill_len), device=args.device)
            return ids.numel(), timed(lambda: model(ids, logits_to_keep=1, use_cache=False))
        results.append(("prefill", args.prefill_batch, *median_rate(prefill, args.reps)))
        phase_done()
        for b in [int(x) for x in args.decode_batch.split(",")]:
            def decode():
                prompts = torch.randint(0, vocab, (b, args.prompt_len), device=args.device)
                mask = torch.ones_like(prompts)
                gen = lambda n: model.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=n,
                                               min_new_tokens=n, pad_token_id=0, eos_token_id=None)
                return b * args.new_tokens, timed(lambda: gen(1 + args.new_tokens)) - timed(lambda: gen(1))
            results.append(("decode", b, *median_rate(decode, args.reps)))
            phase_done()

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def step():
        x = torch.randint(0, vocab, (args.train_batch, args.train_len), device=args.device)
        loss = model(x, labels=x, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()

    results.append(("train_step", args.train_batch,
                    *median_rate(lambda: (args.train_batch * args.train_len, timed(step)), args.reps)))
    phase_done()

    out = {"model": name, "threads": torch.get_num_threads(), "torch": torch.__version__,
           "device": args.device, "dtype": args.dtype,
           "results": [{"name": n, "batch": b, "tokens": k, "seconds": s, "tokens_per_second": k / s, "peak_bytes": p}
                       for (n, b, k, s), p in zip(results, peaks)]}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
