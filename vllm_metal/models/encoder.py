"""BERT-class encoders in MLX: BERT, RoBERTa and XLM-RoBERTa (embedding models such as
all-MiniLM, bge, e5, and cross-encoders such as ms-marco-MiniLM or bge-reranker).

Written here rather than taken from mlx-embeddings, whose GPL-3.0 licence does not
go with this Apache-2.0 project. The sequences of a step are packed row after row
with no padding, and each attends to its own tokens (bidirectionally, no cache).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from vllm_metal.ops import activations

# model_type -> the prefix a task checkpoint (``*ForSequenceClassification``) puts
# before the encoder's weights.
FAMILIES = {"bert": "bert.", "roberta": "roberta.", "xlm-roberta": "roberta."}
_ACTIVATIONS = {"gelu": activations.gelu, "gelu_new": activations.gelu_approx,
                "gelu_pytorch_tanh": activations.gelu_approx, "relu": nn.relu}


class UnsupportedEncoderError(ValueError):
    pass


@dataclass(frozen=True)
class EncoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    activation: str
    eps: float
    max_positions: int
    type_vocab_size: int
    pad_token_id: int

    @classmethod
    def from_dict(cls, config: dict) -> EncoderConfig:
        kind = config.get("model_type")
        if kind not in FAMILIES:
            raise UnsupportedEncoderError(
                f"encoder model_type {kind!r} is not served; vllm-metal runs "
                f"{', '.join(FAMILIES)} encoders")
        act = config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise UnsupportedEncoderError(f"{kind}: hidden_act {act!r} is not served "
                                          f"({', '.join(_ACTIVATIONS)} are)")
        position = config.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise UnsupportedEncoderError(f"{kind}: position_embedding_type {position!r} is "
                                          "not served (absolute is)")
        return cls(kind, config["vocab_size"], config["hidden_size"],
                   config["num_hidden_layers"], config["num_attention_heads"],
                   config["intermediate_size"], act, config.get("layer_norm_eps", 1e-12),
                   config["max_position_embeddings"], config.get("type_vocab_size", 2),
                   config.get("pad_token_id", 0) or 0)

    @property
    def max_tokens(self) -> int:
        """The longest sequence its position embeddings number."""
        return self.max_positions - self.position_offset

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers positions from padding_idx + 1 (position ids of an unpadded
        sequence), BERT from 0."""
        return 0 if self.model_type == "bert" else self.pad_token_id + 1


class _Layer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.num_heads = c.num_heads
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attention_out = nn.Linear(h, h)
        self.attention_norm = nn.LayerNorm(h, eps=c.eps)
        self.intermediate = nn.Linear(h, c.intermediate_size)
        self.out = nn.Linear(c.intermediate_size, h)
        self.out_norm = nn.LayerNorm(h, eps=c.eps)
        self.act = _ACTIVATIONS[c.activation]

    def __call__(self, x: mx.array, spans: list[tuple[int, int]]) -> mx.array:
        """x [T, H], the rows of several sequences; spans: each one's (start, end)."""
        t, h = x.shape
        heads = self.num_heads
        d = h // heads
        q, k, v = self.query(x), self.key(x), self.value(x)
        attended = []
        for start, end in spans:
            def split(y: mx.array) -> mx.array:   # [n, H] -> [1, heads, n, d]
                return y[start:end].reshape(end - start, heads, d).transpose(1, 0, 2)[None]

            a = mx.fast.scaled_dot_product_attention(split(q), split(k), split(v),
                                                     scale=1.0 / math.sqrt(d))
            attended.append(a[0].transpose(1, 0, 2).reshape(end - start, h))
        a = attended[0] if len(attended) == 1 else mx.concatenate(attended)
        x = self.attention_norm(x + self.attention_out(a))
        return self.out_norm(x + self.out(self.act(self.intermediate(x))))


class Encoder(nn.Module):
    """Sequences packed row after row -> their last hidden states, each sequence
    attending to its own tokens only. The row-wise layers (linears, norms, the
    activation) run over all rows at once; on the CPU backend the linears are the
    extension's, which compute a row alike whatever rows share the call, so a
    sequence's hidden states do not depend on its batch."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.config = c
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_positions, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.embeddings_norm = nn.LayerNorm(c.hidden_size, eps=c.eps)
        self.layers = [_Layer(c) for _ in range(c.num_layers)]

    def __call__(self, ids: mx.array, lengths: list[int],
                 types: mx.array | None = None) -> mx.array:
        """ids int32 [T] (sequences of ``lengths`` tokens, T their sum), types int32
        [T] or None (all 0) -> [T, hidden]."""
        offset = self.config.position_offset
        if max(lengths) > self.config.max_tokens:
            raise ValueError(f"{max(lengths)} tokens: this encoder takes at most "
                             f"{self.config.max_tokens}")
        spans, start = [], 0
        for n in lengths:
            spans.append((start, start + n))
            start += n
        positions = mx.array(np.concatenate([np.arange(offset, offset + n) for n in lengths]))
        if types is None:
            types = mx.zeros((start,), dtype=mx.int32)
        x = (self.word_embeddings(ids) + self.token_type_embeddings(types)
             + self.position_embeddings(positions))
        x = self.embeddings_norm(x)
        for layer in self.layers:
            x = layer(x, spans)
        return x


# transformers' names inside an encoder layer -> ours.
_LAYER_NAMES = {
    "attention.self.query": "query", "attention.self.key": "key",
    "attention.self.value": "value", "attention.output.dense": "attention_out",
    "attention.output.LayerNorm": "attention_norm", "intermediate.dense": "intermediate",
    "output.dense": "out", "output.LayerNorm": "out_norm",
}
_EMBEDDING_NAMES = {"embeddings.word_embeddings": "word_embeddings",
                    "embeddings.position_embeddings": "position_embeddings",
                    "embeddings.token_type_embeddings": "token_type_embeddings",
                    "embeddings.LayerNorm": "embeddings_norm"}


def load_encoder(path: str | Path, dtype: mx.Dtype) -> tuple[Encoder, dict[str, mx.array]]:
    """(the encoder with its weights, the checkpoint's other tensors by their names
    without the family's prefix: ``pooler.dense.*``, ``classifier.*``)."""
    path = Path(path)
    config = EncoderConfig.from_dict(json.loads((path / "config.json").read_text()))
    tensors = _read_weights(path)
    prefix = FAMILIES[config.model_type]
    tensors = {k.removeprefix(prefix): v for k, v in tensors.items()}
    model = Encoder(config)
    mine, rest = {}, {}
    for name, value in tensors.items():
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias")
        ours = _our_name(name)
        if ours is None:
            rest[name] = value.astype(dtype)
        else:
            mine[ours] = value.astype(dtype)
    strays = sorted(k for k in rest if k.startswith(("encoder.", "embeddings."))
                    and not k.endswith("position_ids"))
    if strays:
        raise UnsupportedEncoderError(f"{config.model_type}: weights {strays[:4]} are not "
                                      "of the encoder vllm-metal runs")
    model.load_weights(list(mine.items()), strict=True)
    mx.eval(model.parameters())
    return model, rest


def _read_weights(path: Path) -> dict[str, mx.array]:
    """Every tensor of the checkpoint: its safetensors files, else (older BERT-class
    checkpoints ship nothing else) its pytorch_model*.bin read by torch as plain
    tensors (weights_only: no code in the file runs)."""
    tensors: dict[str, mx.array] = {}
    files = sorted(path.glob("*.safetensors"))
    for f in files:
        tensors.update(mx.load(str(f)))
    if files:
        return tensors
    pickles = sorted(path.glob("pytorch_model*.bin"))
    if not pickles:
        raise UnsupportedEncoderError(f"{path}: no *.safetensors or pytorch_model*.bin weights")
    import torch

    for f in pickles:
        for name, t in torch.load(str(f), map_location="cpu", weights_only=True).items():
            tensors[name] = mx.array(t.float().numpy() if t.is_floating_point() else t.numpy())
    return tensors


def _our_name(name: str) -> str | None:
    for theirs, ours in _EMBEDDING_NAMES.items():
        if name.startswith(theirs + "."):
            return ours + name[len(theirs):]
    if name.startswith("encoder.layer."):
        index, _, inner = name[len("encoder.layer."):].partition(".")
        for theirs, ours in _LAYER_NAMES.items():
            if inner.startswith(theirs + "."):
                return f"layers.{index}.{ours}{inner[len(theirs):]}"
    return None
