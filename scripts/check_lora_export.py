#!/usr/bin/env python3
"""Checks a hacpo LoRA checkpoint the way a user of peft would load it.

  python scripts/check_lora_export.py ADAPTER_DIR MERGED_DIR

ADAPTER_DIR is a LoRA policy's part of a hacpo checkpoint (runs/x/checkpoints/step-N/agent-K,
adapter_config.json + adapter_model.safetensors); MERGED_DIR is what
`hacpo convert --merge-lora ADAPTER_DIR --out MERGED_DIR` wrote from it. The script loads the
base model that adapter_config.json names with transformers, applies the adapter with
`PeftModel.from_pretrained`, and compares its logits on random tokens with the merged model's
(which hacpo computed): equal within 1e-4 means peft reads hacpo's tensor names, layouts and
scaling as hacpo meant them. Exit 1 otherwise.

Needs: pip install torch transformers peft safetensors
"""
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    adapter, merged = sys.argv[1], sys.argv[2]
    base_path = json.load(open(os.path.join(adapter, "adapter_config.json")))["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(base, adapter).eval()
    ours = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32, attn_implementation="eager").eval()
    torch.manual_seed(0)
    ids = torch.randint(0, min(base.config.vocab_size, ours.config.vocab_size), (2, 24))
    with torch.no_grad():
        a = peft_model(ids).logits
        b = ours(ids).logits
        plain = peft_model.get_base_model()
        with peft_model.disable_adapter():
            c = plain(ids).logits
    diff = (a - b).abs().max().item()
    moved = (a - c).abs().max().item()
    print(f"peft adapter vs hacpo merge: max |Δlogit| = {diff:.3g}; the adapter moves logits by up to {moved:.3g}")
    if diff > 1e-4:
        sys.exit(1)


if __name__ == "__main__":
    main()
