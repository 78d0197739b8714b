#!/usr/bin/env python3
"""Tiny random checkpoints with reference logits from Hugging Face transformers.

Writes tests/fixtures/models/<name>/ for the parity tests in tests/model_parity.rs:
  config.json, model.safetensors (or shards + index), reference.safetensors, reference.json

Each fixture exercises a different part of the three families:
  llama31-tiny  Llama, llama3 RoPE scaling, GQA 4/2, untied, f32, transformers-4.x config layout
  llama32-tiny  Llama, tied embeddings, GQA 6/2, bf16 weights, transformers-5.x config layout
  qwen2-tiny    Qwen2, q/k/v biases, tied, GQA 4/2, f16 weights, sharded safetensors, 4.x layout
  qwen3-tiny    Qwen3, q/k RMSNorm, head_dim 32 != hidden/heads 16, GQA 4/2, untied, 5.x layout

References are computed in float32 with eager attention from the weights exactly as stored
(bf16/f16 fixtures are rounded first). Greedy continuations are computed by a plain argmax
loop over full forward passes, and the script refuses prompts whose greedy path has a
top-1/top-2 logit gap below 1e-3, so the Rust comparison cannot flip on float noise.

Regenerate (needs network for pip only):
  python3 -m venv /tmp/refenv
  /tmp/refenv/bin/pip install torch==2.15.0 transformers==5.23.0 safetensors numpy
  /tmp/refenv/bin/python scripts/make_model_fixtures.py
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")
VOCAB = 512
GREEDY_TOKENS = 32
MIN_GAP = 1e-3


def randomize(model, seed):
    """Weights with visible structure: transformers' 0.02 init makes every logit ~0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def greedy(model, prompt):
    ids = list(prompt)
    gaps = []
    for _ in range(GREEDY_TOKENS):
        logits = model(torch.tensor([ids])).logits[0, -1]
        top = torch.topk(logits, 2).values
        gaps.append(float(top[0] - top[1]))
        ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], min(gaps)


def robust_prompt(model, length, seed):
    """A random prompt of `length` tokens whose greedy path has no near-ties."""
    for attempt in range(100):
        g = torch.Generator().manual_seed(seed * 1000 + attempt)
        prompt = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        cont, gap = greedy(model, prompt)
        if gap >= MIN_GAP:
            return prompt, cont
    raise SystemExit(f"no robust prompt of length {length}")


def build(name, cls, config, dtype, layout, shard=False, seed=0):
    torch.manual_seed(seed)
    model = cls(config).eval()
    randomize(model, seed)
    if dtype != torch.float32:  # round the weights (not the RoPE buffers) to the storage dtype
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(dtype).to(torch.float32))
    out = os.path.join(ROOT, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if shard:
        names = list(state)
        half = len(names) // 2
        shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
        weight_map = {}
        for fname, keys in shards.items():
            save_file({k: state[k] for k in keys}, os.path.join(out, fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in keys})
        total = sum(v.numel() * v.element_size() for v in state.values())
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    else:
        save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    cfg = json.loads(config.to_json_string())
    cfg["dtype"] = str(dtype).replace("torch.", "")
    if layout == "4.x":  # the layout of transformers 4.x checkpoints on the hub
        rp = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rp.pop("rope_theta")
        rope_type = rp.pop("rope_type")
        if rope_type != "default":
            cfg["rope_scaling"] = {"rope_type": rope_type, **rp}
        cfg["torch_dtype"] = cfg.pop("dtype")
        cfg["transformers_version"] = "4.51.0"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)

    g = torch.Generator().manual_seed(seed + 7)
    prompt_a = torch.randint(0, VOCAB, (23,), generator=g).tolist()
    prompt_b = torch.randint(0, VOCAB, (700,), generator=g).tolist()
    with torch.no_grad():
        logits_a = model(torch.tensor([prompt_a])).logits[0].float().contiguous()
        logits_b = model(torch.tensor([prompt_b])).logits[0, -1].float().contiguous()
        greedy_cases = []
        for i, length in enumerate([5, 13, 1]):
            prompt, cont = robust_prompt(model, length, seed + 100 + i)
            greedy_cases.append({"prompt": prompt, "continuation": cont})
    save_file({"logits_a": logits_a, "logits_b_last": logits_b}, os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                   "prompt_a": prompt_a, "prompt_b": prompt_b, "greedy": greedy_cases}, f)
    print(name, "params", sum(p.numel() for p in model.parameters()))


def main():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  attn_implementation="eager", bos_token_id=1, eos_token_id=2)
    build("llama31-tiny", LlamaForCausalLM,
          LlamaConfig(**common, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64}),
          torch.float32, "4.x", seed=1)
    build("llama32-tiny", LlamaForCausalLM,
          LlamaConfig(**{**common, "hidden_size": 96, "num_attention_heads": 6}, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
          torch.bfloat16, "5.x", seed=2)
    build("qwen2-tiny", Qwen2ForCausalLM,
          Qwen2Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
          torch.float16, "4.x", shard=True, seed=3)
    build("qwen3-tiny", Qwen3ForCausalLM,
          Qwen3Config(**common, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
          torch.float32, "5.x", seed=4)


if __name__ == "__main__":
    main()
