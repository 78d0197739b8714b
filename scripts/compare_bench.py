#!/usr/bin/env python3
"""hacpo vs PyTorch eager throughput, interleaved so that machine noise hits both alike.

Runs `hacpo bench --format json` and `scripts/bench_pytorch.py` alternately --rounds times
with the same sizes, then prints per phase the median tokens/s of each and their ratio.

Usage:
  python3 scripts/compare_bench.py --hacpo target/release/hacpo --python /path/to/venv/bin/python
  python3 scripts/compare_bench.py ... --gguf "$(bash scripts/fetch-smollm2.sh)"
"""
import argparse
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hacpo", default=os.path.join(HERE, "..", "target", "release", "hacpo"))
    ap.add_argument("--python", default="python3")
    ap.add_argument("--gguf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    model = ["--model", args.gguf] if args.gguf else []
    torch_model = ["--gguf", args.gguf] if args.gguf else []
    rates = {"hacpo": {}, "torch": {}}
    machine = None
    for _ in range(args.rounds):
        for who, cmd in [("hacpo", [args.hacpo, "bench", "--format", "json", "--reps", str(args.reps)] + model),
                         ("torch", [args.python, os.path.join(HERE, "bench_pytorch.py"), "--reps", str(args.reps)] + torch_model)]:
            out = run_json(cmd)
            machine = machine or out.get("machine")
            for r in out["results"]:
                rates[who].setdefault(f"{r['name']} (batch {r['batch']})", []).append(r["tokens_per_second"])
    print(f"{'phase':<24} {'hacpo tok/s':>12} {'torch tok/s':>12} {'ratio':>7}")
    for phase, values in rates["hacpo"].items():
        h, t = statistics.median(values), statistics.median(rates["torch"][phase])
        print(f"{phase:<24} {h:>12.1f} {t:>12.1f} {h / t:>6.2f}x")
    if machine:  # hacpo bench names it since 2026-12-02; an older build does not
        numbers = f" (family {machine['family']}, model {machine['model']})" if machine.get("family") is not None else ""
        print(f"machine: {machine['cpu']}{numbers}, {machine['cores']} cores, {' '.join(machine['flags'])}")


if __name__ == "__main__":
    main()
