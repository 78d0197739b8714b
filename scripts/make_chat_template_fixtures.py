#!/usr/bin/env python3
"""Reference chat-template renderings from transformers' apply_chat_template.

Writes tests/fixtures/chat_templates.json for tests/tokenizer.rs: for each real chat template
in tests/shared/assets (Qwen2.5, Qwen3, Llama-3.1, Llama-3.2, and the ones inside the
tokenizer_config.json files; the Llama-3.1 tokenizer as scripts/fetch-test-assets.sh fetches it) and a set of conversations, the rendered text and its token ids
(encoded without special tokens, as apply_chat_template(tokenize=True) does).

Regenerate:
  python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install transformers==5.23.0 jinja2
  bash scripts/fetch-test-assets.sh && /tmp/refenv/bin/python scripts/make_chat_template_fixtures.py
"""
import json
import os

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("HACPO_SHARED", os.path.join(HERE, "..", "tests", "shared"))
FETCHED = os.path.join(os.path.expanduser("~"), ".cache", "hacpo", "test-assets")


def asset(rel):
    """A test asset: from SHARED, else as scripts/fetch-test-assets.sh fetched it."""
    here = os.path.join(SHARED, rel)
    return here if os.path.exists(here) else os.path.join(FETCHED, rel)
OUT = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates.json")

# (case id, tokenizer dir under assets/tokenizers, template file under assets/chat-templates or None
#  for the tokenizer's own template)
TEMPLATES = [
    ("qwen2.5", "qwen3", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    ("qwen3", "qwen3", "Qwen-Qwen3-0.6B.jinja"),
    ("qwen3-tokenizer-config", "qwen3", None),
    ("llama3.1", "llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("llama3.2", "llama3.1", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    ("llama3.1-tokenizer-config", "llama3.1", None),
]

CONVERSATIONS = [
    ("single", [{"role": "user", "content": "What is 2+2?"}], True, {}),
    ("system", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there!"}], True, {}),
    ("multi-turn", [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
                    {"role": "user", "content": "Tell me a joke."}], True, {}),
    ("no-generation-prompt", [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}],
     False, {}),
    ("thinking-history", [{"role": "user", "content": "Solve 3*7."},
                          {"role": "assistant", "content": "<think>\n3*7 is 21.\n</think>\n\nThe answer is 21."},
                          {"role": "user", "content": "And 4*5?"}], True, {}),
    ("no-thinking", [{"role": "user", "content": "Compute 12 + 30. Put the answer in \\boxed{}."}], True,
     {"enable_thinking": False}),
    ("unicode", [{"role": "user", "content": "Привет, 世界 🌍 — naïve café\n\ttabs  and  spaces "}], True, {}),
]


def main():
    cases = []
    for tid, tok_dir, template_file in TEMPLATES:
        tok = AutoTokenizer.from_pretrained(asset(os.path.join("assets", "tokenizers", tok_dir)))
        if template_file:
            with open(asset(os.path.join("assets", "chat-templates", template_file))) as f:
                template = f.read()
        else:
            template = tok.chat_template
        for cid, messages, gen, extra in CONVERSATIONS:
            kwargs = dict(extra)
            if tid.startswith("llama3.2"):
                kwargs["date_string"] = "21 Nov 2026"  # the template otherwise uses today's date
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                           add_generation_prompt=gen, **kwargs)
            ids = tok.encode(text, add_special_tokens=False)
            cases.append({"template": tid, "tokenizer": tok_dir, "template_file": template_file,
                          "conversation": cid, "messages": messages, "add_generation_prompt": gen,
                          "context": kwargs, "text": text, "ids": ids})
    with open(OUT, "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    print(len(cases), "cases ->", OUT)


if __name__ == "__main__":
    main()
