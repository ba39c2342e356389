"""Tiny random-weight HF checkpoints built locally, for tests that may not reach a hub.

`make_tiny_model(path, family)` writes config.json, model.safetensors,
generation_config.json and a byte-level BPE tokenizer trained on the built-in
English text below. Weights are float32, seeded, and scaled for wide greedy
margins (logit std ~20, median top-1/top-2 gap ~8 logits where std-0.02 inits give
near-uniform logits), so token-for-token comparisons between two implementations
are not flipped by fp32 summation order. Special tokens and non-ASCII byte tokens
are never generated (their output rows are damped), so EOS does not cut runs short.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
ROPE_SCALING_KINDS = ("linear", "llama3", "yarn")

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# "<|endoftext|>" is in the vocab because transformers' Qwen2Tokenizer adds it otherwise.
EXTRA_SPECIAL = "<|endoftext|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS, EXTRA_SPECIAL)

# One turn per message, closed by EOS; the prompt for a reply ends with the assistant tag.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    # tie_word_embeddings differs across families so both lm_head layouts get exercised.
    "llama": dict(arch="LlamaForCausalLM", tie=False, rope_theta=500000.0),
    "mistral": dict(arch="MistralForCausalLM", tie=True, rope_theta=1000000.0),
    "qwen2": dict(arch="Qwen2ForCausalLM", tie=True, rope_theta=1000000.0),
    "qwen3": dict(arch="Qwen3ForCausalLM", tie=False, rope_theta=1000000.0),
}

# Init gains (std * sqrt(fan_in)). Attention and MLP writes dominate the residual so the
# next token depends on context and tied models are not pulled back to the input token.
_GAIN_QK = 2.0
_GAIN_V = 1.0
_GAIN_OUT = 6.0
_GAIN_MLP = 2.5
# Logit std ~20 (std-0.02 inits give near-uniform logits that tie under fp32 reordering).
_LOGIT_STD = 20.0
# Log-normal row norms give the logits a heavier upper tail: wider top-1/top-2 gaps.
_ROW_NORM_SIGMA = 0.3
# Rows of damped tokens (see _damped_ids) are scaled down so they are never sampled.
_SPECIAL_ROW_SCALE = 0.05


def make_tiny_model(
    path: str | Path,
    family: str = "llama",
    *,
    quantize_bits: int | None = None,
    group_size: int = 64,
    rope_scaling: str | dict | None = None,
    seed: int = 0,
    head_dim: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    num_hidden_layers: int = 2,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool | None = None,
) -> Path:
    """Write a complete HF-format model directory at `path` and return it.

    `rope_scaling`: None, one of ROPE_SCALING_KINDS, or a full HF rope_scaling dict.
    `quantize_bits` 4 or 8 writes an MLX affine-quantized checkpoint instead.
    `hidden_size` defaults to 128, except qwen2 (mlx-lm derives its head_dim as
    hidden_size / num_attention_heads) where it is num_attention_heads * head_dim.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if quantize_bits not in (None, 4, 8):
        raise ValueError(f"quantize_bits must be None, 4 or 8, got {quantize_bits!r}")
    if group_size not in (32, 64):
        raise ValueError(f"group_size must be 32 or 64, got {group_size!r}")
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({num_key_value_heads})"
        )
    if num_hidden_layers < 1:
        raise ValueError(f"num_hidden_layers must be >= 1, got {num_hidden_layers!r}")
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim must be 64 or 128, got {head_dim!r}")
    if hidden_size is None:
        hidden_size = num_attention_heads * head_dim if family == "qwen2" else 128
    if family == "qwen2" and hidden_size != num_attention_heads * head_dim:
        raise ValueError(
            "qwen2 needs hidden_size == num_attention_heads * head_dim "
            f"({num_attention_heads * head_dim}), got hidden_size={hidden_size}"
        )
    path = Path(path)
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"path {str(path)!r} exists and is not empty")

    tokenizer = _train_tokenizer(vocab_size)
    config = _config(
        family,
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_scaling=_rope_scaling(rope_scaling, max_position_embeddings),
        tie_word_embeddings=tie_word_embeddings,
        token_ids={t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS},
    )
    weights = _weights(config, np.random.default_rng(seed), _damped_ids(tokenizer))

    if quantize_bits is None:
        _write_float_model(path, config, weights, tokenizer)
    else:
        with tempfile.TemporaryDirectory() as float_dir:
            _write_float_model(Path(float_dir), config, weights, tokenizer)
            _quantize(Path(float_dir), path, quantize_bits, group_size)
    return path


def cached_tiny_model(family: str = "llama", **kwargs: Any) -> Path:
    """Build once per process (keyed by arguments) into a temp dir removed at exit."""
    return cached_build(make_tiny_model, family, kwargs)


def cached_build(build: Callable[..., Path], family: str, kwargs: dict[str, Any]) -> Path:
    """``build(dir, family, **kwargs)`` once per process per arguments, in a temp
    dir removed at exit."""
    # JSON keys make dict arguments (a custom rope_scaling) cacheable too.
    return _cached(build, family, json.dumps(kwargs, sort_keys=True))


@functools.cache
def _cached(build: Callable[..., Path], family: str, kwargs_json: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"{family}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return build(root / "model", family, **json.loads(kwargs_json))


def _rope_scaling(kind: str | dict | None, max_pos: int) -> dict | None:
    """HF rope_scaling dict for a named kind; originals are a quarter of the window."""
    if kind is None or isinstance(kind, dict):
        return kind
    original = max_pos // 4
    if kind == "linear":
        return {"rope_type": "linear", "factor": 2.0}
    if kind == "llama3":
        return {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        }
    if kind == "yarn":
        return {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": original,
        }
    raise ValueError(
        f"rope_scaling must be None, a dict or one of {ROPE_SCALING_KINDS}, got {kind!r}"
    )


def _config(
    family: str, *, token_ids: dict[str, int], tie_word_embeddings, rope_scaling, **dims
) -> dict:
    """HF config.json contents; legacy rope_theta/rope_scaling keys, which both
    transformers (into rope_parameters) and mlx-lm read."""
    spec = _FAMILY_DEFAULTS[family]
    tie = spec["tie"] if tie_word_embeddings is None else bool(tie_word_embeddings)
    config = {
        "architectures": [spec["arch"]],
        "model_type": family,
        **dims,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": spec["rope_theta"],
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": tie,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": token_ids[BOS],
        "eos_token_id": token_ids[EOS],
        "pad_token_id": token_ids[PAD],
    }
    if family in ("llama", "qwen3"):
        config.update(attention_bias=False, mlp_bias=False)
    if family in ("mistral", "qwen2", "qwen3"):
        config["sliding_window"] = None
    if family in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, max_window_layers=dims["num_hidden_layers"])
    return config


def _damped_ids(tokenizer) -> list[int]:
    """Special tokens and byte tokens that do not decode to printable ASCII.

    Never sampling them keeps generated text valid UTF-8, so streaming detokenizers
    of two engines cannot disagree on held-back partial characters.
    """
    ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
    for i in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([i])
        if not (text.isascii() and (text.isprintable() or text == "\n")):
            ids.append(i)
    return sorted(set(ids))


def _weights(
    config: dict, rng: np.random.Generator, damped_ids: list[int]
) -> dict[str, np.ndarray]:
    """HF parameter names -> float32 arrays, [out_features, in_features] for linears."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, hd = (
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["head_dim"],
    )
    vocab = config["vocab_size"]
    family = config["model_type"]

    def linear(out_dim: int, in_dim: int, gain: float) -> np.ndarray:
        return rng.normal(0.0, gain / np.sqrt(in_dim), (out_dim, in_dim)).astype(np.float32)

    def norm(dim: int) -> np.ndarray:
        # Non-unit weights so a loader that drops norm weights changes the output.
        return rng.uniform(0.8, 1.2, dim).astype(np.float32)

    row_scale = np.exp(rng.normal(0.0, _ROW_NORM_SIGMA, (vocab, 1))).astype(np.float32)
    embed = rng.normal(0.0, 1.0, (vocab, hidden)).astype(np.float32) * row_scale
    w = {"model.embed_tokens.weight": embed}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = linear(heads * hd, hidden, _GAIN_QK)
        w[p + "self_attn.k_proj.weight"] = linear(kv_heads * hd, hidden, _GAIN_QK)
        w[p + "self_attn.v_proj.weight"] = linear(kv_heads * hd, hidden, _GAIN_V)
        w[p + "self_attn.o_proj.weight"] = linear(hidden, heads * hd, _GAIN_OUT)
        if family == "qwen2":
            # A v bias passes through attention unchanged: a large one would add the same
            # vector at every position and pull every step toward one token.
            for name, dim, std in (
                ("q", heads * hd, 0.5),
                ("k", kv_heads * hd, 0.5),
                ("v", kv_heads * hd, 0.05),
            ):
                bias = rng.normal(0.0, std, dim).astype(np.float32)
                w[p + f"self_attn.{name}_proj.bias"] = bias
        if family == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1.5 * norm(hd)
            w[p + "self_attn.k_norm.weight"] = 1.5 * norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = linear(inter, hidden, _GAIN_MLP)
        w[p + "mlp.up_proj.weight"] = linear(inter, hidden, _GAIN_MLP)
        w[p + "mlp.down_proj.weight"] = linear(hidden, inter, _GAIN_OUT)
    w["model.norm.weight"] = norm(hidden)
    if config["tie_word_embeddings"]:
        # The final norm sets the logit scale when lm_head is the unit-std embedding.
        w["model.norm.weight"] *= _LOGIT_STD / np.sqrt(hidden)
        # Tied rows scale input and output alike: damp them on both sides.
        embed[damped_ids] *= _SPECIAL_ROW_SCALE
    else:
        head = linear(vocab, hidden, _LOGIT_STD) * row_scale
        head[damped_ids] *= _SPECIAL_ROW_SCALE
        w["lm_head.weight"] = head
    return w


def _write_float_model(path: Path, config: dict, weights: dict, tokenizer) -> None:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    _write_json(path / "config.json", config)
    _write_json(
        path / "generation_config.json",
        {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )
    tokenizer.save(str(path / "tokenizer.json"))
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "model_max_length": config["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )


def _quantize(src: Path, dst: Path, bits: int, group_size: int) -> None:
    """MLX affine quantization of every linear and the embedding via mlx-lm's own API."""
    import contextlib
    import io

    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(src, lazy=True)
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints bits-per-weight
        model, config = quantize_model(model, config, group_size, bits)
    save_model(dst, model)
    save_config(config, dst / "config.json")
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)


@functools.lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    """Train once per process; BPE training is deterministic for a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.split("\n\n"), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok.to_str()


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer

    if not isinstance(vocab_size, int) or vocab_size < 300:
        raise ValueError(f"vocab_size must be an int >= 300, got {vocab_size!r}")
    tok = Tokenizer.from_str(_tokenizer_json(vocab_size))
    if tok.get_vocab_size() != vocab_size:
        # BPE training stops when the corpus has no pair left to merge.
        raise ValueError(
            f"vocab_size={vocab_size} is more than the built-in corpus yields "
            f"({tok.get_vocab_size()} tokens); pick a smaller vocab_size"
        )
    return tok


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


# Training text for the tokenizer, written for this project: everyday English so
# prompts such as "The capital of France is" split into whole-word tokens.
CORPUS = """\
The capital of France is Paris, a city on the river Seine. The capital of Italy is Rome,
and the capital of Germany is Berlin. Many people visit these cities every year to see
old churches, long streets, small cafes and large museums full of paintings.

Hello, my name is Anna and I live in a small house near the sea. Every morning I walk my
dog along the beach before work. My brother likes to cook, so he makes breakfast for the
whole family on Sunday. We eat bread, eggs, cheese and fresh fruit, and we drink coffee.

Once upon a time there was a little girl who found a map in her grandfather's garden. The
map showed a path through the forest to an old stone tower. She packed a bag with water,
apples and a warm coat, and she started walking when the sun came up over the hills.

A computer program is a list of instructions that a machine can follow. Programmers write
code in languages such as Python, C and Rust. A good program is easy to read, it handles
errors clearly, and it has tests that show it does what it should do.

The weather today is cold and windy, with rain in the afternoon. Tomorrow will be warmer
and the sky should be clear by the evening. In summer the days are long and the nights
are short; in winter it gets dark early and snow may fall in the mountains.

Water boils at one hundred degrees at sea level. The earth goes around the sun once a
year, and the moon goes around the earth about once a month. Light from the sun takes
roughly eight minutes to reach us. Plants use light, water and air to grow.

What is the best way to learn a new language? Read a little every day, listen to people
speak, and do not be afraid to make mistakes. Write short notes, ask simple questions,
and answer them in full sentences. Practice is more useful than perfect grammar.

Our team meets on Monday to plan the work for the week. Each person says what they did,
what they will do next, and what is blocking them. Then we pick the most important tasks,
write them on the board, and decide who will review each change before it is merged.

The market opens at eight. Farmers bring potatoes, carrots, onions, tomatoes and green
beans; a baker sells bread and cakes; a woman at the corner sells flowers in every color:
red, yellow, blue, white and purple. Prices are written on small black signs.

Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty,
thirty, forty, fifty, hundred, thousand, million. Days: Monday, Tuesday, Wednesday, Thursday,
Friday, Saturday, Sunday. Months: January, February, March, April, May, June, July, August,
September, October, November, December. 1 2 3 4 5 6 7 8 9 10 100 2024 3.14

The history of science is a story of careful questions. Someone notices something odd,
measures it, and tries to explain it. Other people repeat the measurement, find where the
explanation fails, and propose a better one. Over time the ideas that survive become
the things that students learn in school.

Please answer the question below. Keep your answer short and clear. If you do not know,
say that you do not know. Thank you for your help! Can you tell me a joke? Why did the
chicken cross the road? To get to the other side. How are you doing today? I am fine.

A doctor listens to the patient, asks about the pain, and checks the heart and lungs.
A teacher explains a problem on the board and gives the class time to try it. A driver
stops at the red light, waits for the green one, and then turns left toward the station.

The king and the queen lived in a castle on a hill. Their son, the prince, wanted to sail
across the ocean to find new lands. He built a ship with his friends, and after many weeks
they saw an island covered with tall trees, birds and bright green grass.
"""
