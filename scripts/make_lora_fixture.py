#!/usr/bin/env python3
"""PEFT LoRA adapters on the tiny fixture models, with reference logits from peft + transformers.

Writes tests/fixtures/lora/<name>/ for tests/lora.rs:
  adapter_config.json, adapter_model.safetensors   exactly as PeftModel.save_pretrained writes them
  reference.safetensors                            logits_a: the adapted model's logits on prompt_a
                                                   of the base fixture's reference.json

  qwen3-lora    on qwen3-tiny (head_dim 32 != hidden/heads): r 4, alpha 8, all seven projections
  llama-rslora  on llama31-tiny: r 2, alpha 4, rsLoRA scaling (alpha/sqrt(r)), q_proj and v_proj only

The adapters are random (init_lora_weights=False), so lora_B is not zero and the adapter changes
the logits; the script checks that it does. base_model_name_or_path is the base fixture's path
relative to the adapter directory, which hacpo resolves beside the adapter.

Regenerate (needs network for pip only):
  python3 -m venv /tmp/refenv
  /tmp/refenv/bin/pip install torch==2.15.0 transformers==5.23.0 peft==0.21.2 safetensors
  /tmp/refenv/bin/python scripts/make_lora_fixture.py
"""
import json
import os

import peft
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

ADAPTERS = {
    "qwen3-lora": dict(
        base="qwen3-tiny",
        config=LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    ),
    "llama-rslora": dict(
        base="llama31-tiny",
        config=LoraConfig(
            r=2,
            lora_alpha=4,
            lora_dropout=0.0,
            target_modules=["q_proj", "v_proj"],
            use_rslora=True,
            init_lora_weights=False,
            task_type="CAUSAL_LM",
        ),
    ),
}


def main():
    torch.manual_seed(0)
    for name, spec in ADAPTERS.items():
        base_dir = os.path.join(ROOT, "models", spec["base"])
        out = os.path.join(ROOT, "lora", name)
        os.makedirs(out, exist_ok=True)
        prompt = json.load(open(os.path.join(base_dir, "reference.json")))["prompt_a"]
        ids = torch.tensor([prompt])

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
        base.eval()
        with torch.no_grad():
            base_logits = base(ids).logits[0].clone()
        model = get_peft_model(base, spec["config"])
        model.eval()
        with torch.no_grad():
            logits = model(ids).logits[0].contiguous()
        change = (logits - base_logits).abs().max().item()
        assert change > 1e-2, f"{name}: the adapter barely changes the logits ({change})"

        model.save_pretrained(out, safe_serialization=True)
        # peft records the path it was given; point it at the base fixture relative to the adapter.
        cfg_path = os.path.join(out, "adapter_config.json")
        cfg = json.load(open(cfg_path))
        cfg["base_model_name_or_path"] = os.path.join("..", "..", "models", spec["base"])
        json.dump(cfg, open(cfg_path, "w"), indent=2, sort_keys=True)
        readme = os.path.join(out, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
        save_file({"logits_a": logits}, os.path.join(out, "reference.safetensors"))
        print(f"{name}: peft {peft.__version__}, adapter changes logits by up to {change:.3f}")


if __name__ == "__main__":
    main()
