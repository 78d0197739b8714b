#!/usr/bin/env python3
"""Greedy chat completions of the real SmolLM2-135M-Instruct GGUF, computed by transformers.

Writes tests/fixtures/smollm2_reference.json for tests/smollm2.rs: for each chat prompt, the
prompt ids (the GGUF's chat template, add_generation_prompt=True), the greedy continuation
(until EOS or 48 new tokens) and the teacher-forced log-probability of each generated token.
transformers dequantises the Q4_1 weights to float32 exactly as hacpo does, so the token
sequences must agree exactly.

Regenerate:
  python3 -m venv /tmp/refenv
  /tmp/refenv/bin/pip install torch==2.15.0 transformers==5.23.0 accelerate gguf
  /tmp/refenv/bin/python scripts/make_smollm2_reference.py "$(bash scripts/fetch-smollm2.sh)"
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "smollm2_reference.json")
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 12 + 30? Answer with a number.",
    "Explain gravity to a child in two sentences.",
]
MAX_NEW = 48


def main():
    gguf = sys.argv[1]
    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    eos = 2  # <|im_end|>
    cases = []
    for text in PROMPTS:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        prompt = tok.encode(rendered, add_special_tokens=False)
        ids = list(prompt)
        gaps = []
        with torch.no_grad():
            for _ in range(MAX_NEW):  # plain argmax loop: no generate() defaults involved
                last = model(torch.tensor([ids])).logits[0, -1]
                top = torch.topk(last, 2).values
                gaps.append(float(top[0] - top[1]))
                nxt = int(torch.argmax(last))
                ids.append(nxt)
                if nxt == eos:
                    break
            logits = model(torch.tensor([ids])).logits[0].float()
        out = ids[len(prompt):]
        logp = torch.log_softmax(logits, -1)
        lps = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(out)]
        cases.append({"user": text, "rendered": rendered, "prompt_ids": prompt, "completion_ids": out,
                      "completion_logprobs": lps, "min_top2_gap": min(gaps), "text": tok.decode(out, skip_special_tokens=True)})
        print(repr(text), "->", repr(cases[-1]["text"]))
    with open(OUT, "w") as fh:
        json.dump({"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                   "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                   "cases": cases}, fh, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
