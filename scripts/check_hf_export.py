#!/usr/bin/env python3
"""Checks that a directory written by `hacpo convert` (or any hacpo save) loads in transformers
and generates what hacpo generates.

Usage:
  hacpo convert --model "$(bash scripts/fetch-smollm2.sh)" --out /tmp/smol-hf --dtype bf16
  python scripts/check_hf_export.py /tmp/smol-hf target/release/hacpo
Needs: torch, transformers.
"""
import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "What is the capital of France?"


def main():
    model_dir, hacpo = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    eos = model.generation_config.eos_token_id
    out = model.generate(ids, do_sample=False, max_new_tokens=32, eos_token_id=eos)[0, ids.shape[1]:].tolist()
    ours = json.loads(subprocess.run(
        [hacpo, "generate", "--model", model_dir, "--chat", "--greedy", "--max-new-tokens", "32",
         "--format", "json", "--prompt", PROMPT], check=True, capture_output=True, text=True).stdout)
    print(type(model).__name__, "loaded; transformers:", out)
    print("hacpo:", ours["completions"][0]["ids"])
    assert ours["prompt_ids"] == ids[0].tolist(), "prompt ids differ"
    assert ours["completions"][0]["ids"] == out, "greedy tokens differ"
    print("OK: transformers loads the directory and generates the same tokens")


if __name__ == "__main__":
    main()
