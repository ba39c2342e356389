"""A tiny random-weight qwen3 checkpoint whose tokenizer and chat template speak tools
and thinking, for the tool-calling, reasoning and Anthropic Messages tests.

`make_agent_checkpoint(path)` is tests/tiny_models.py's qwen3 model (same weights
recipe, same BPE tokenizer) with six more tokens: `<think>`, `</think>`,
`<tool_call>` and `</tool_call>` (single tokens, as in Qwen3 and Hermes
checkpoints: vLLM's reasoning parsers find the end of reasoning by token id), and
Llama 3's `<|python_tag|>` and Mistral's `[TOOL_CALLS]`, without which those tool
parsers refuse the tokenizer; and a ChatML-like template that renders `tools`, assistant `tool_calls`,
`tool` results and the `enable_thinking` switch the way Qwen3's does:
with `enable_thinking=False` the generation prompt ends with an empty
`<think>\\n\\n</think>\\n\\n`. Like the special tokens, the added tokens'
output rows are damped: the random model never writes them by itself, so a
test decides (grammar, logit_bias) when they appear.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tiny_models import (EOS, _config, _damped_ids, _train_tokenizer, _weights,
                               _write_float_model, _write_json, cached_build)

THINK_START, THINK_END = "<think>", "</think>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
# The call markers vLLM's llama3_json and mistral parsers look up at startup.
PYTHON_TAG, MISTRAL_CALLS = "<|python_tag|>", "[TOOL_CALLS]"
ADDED_TOKENS = (THINK_START, THINK_END, TOOL_CALL_START, TOOL_CALL_END, PYTHON_TAG,
                MISTRAL_CALLS)
VOCAB = 1024

# Tools as a system block, calls as Hermes' <tool_call>{json}</tool_call>, tool results
# as a user turn; `arguments` may reach the template as a JSON string or (vLLM parses
# them for templates) a dict.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "You may call these tools:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>{{ eos_token }}\n"
    "{% elif messages[0].role == 'system' %}<|system|>\n{{ messages[0].content }}"
    "{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'assistant' %}<|assistant|>\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}<tool_call>\n{\"name\": "
    "{{ call.function.name | tojson }}, \"arguments\": "
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}{{ eos_token }}\n"
    "{% elif message.role == 'tool' %}<|user|>\n<tool_response>\n{{ message.content }}"
    "\n</tool_response>{{ eos_token }}\n"
    "{% else %}<|{{ message.role }}|>\n{{ message.content }}{{ eos_token }}\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def make_agent_checkpoint(path: str | Path, family: str = "qwen3", *, seed: int = 0) -> Path:
    """Write the checkpoint directory at ``path`` and return it."""
    from tokenizers import AddedToken

    path = Path(path)
    tokenizer = _train_tokenizer(VOCAB - len(ADDED_TOKENS))
    # special=False, as Qwen3 marks them: they stay in decoded text, where the
    # parsers look for them.
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in ADDED_TOKENS])
    assert tokenizer.get_vocab_size() == VOCAB
    special = {t: tokenizer.token_to_id(t) for t in ("<s>", EOS, "<pad>")}
    config = _config(family, vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, max_position_embeddings=4096, rope_scaling=None,
                     tie_word_embeddings=None, token_ids=special)
    damped = sorted({*_damped_ids(tokenizer), *(tokenizer.token_to_id(t) for t in ADDED_TOKENS)})
    weights = _weights(config, np.random.default_rng(seed), damped)
    _write_float_model(path, config, weights, tokenizer)
    tokenizer_config = path / "tokenizer_config.json"

    settings = json.loads(tokenizer_config.read_text())
    settings["chat_template"] = CHAT_TEMPLATE
    _write_json(tokenizer_config, settings)
    return path


def cached_agent_checkpoint() -> Path:
    """Built once per process into a temp dir removed at exit."""
    return cached_build(make_agent_checkpoint, "qwen3", {})
