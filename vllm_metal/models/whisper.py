"""Whisper (speech-to-text, encoder-decoder) in MLX, on the paged KV cache.

The encoder turns one clip's log-mel features [num_mel_bins, 2 x max_source_positions]
into ``max_source_positions`` rows (two convolutions, sinusoidal positions, pre-LN
blocks with unmasked attention). The decoder runs a packed step of tokens like any
causal LM on the paged cache (self-attention, learned positions) and, in every
layer, attends to its request's encoder rows through a second, cross-attention
cache: the keys and values of a request's encoder rows are written into its cross
pages once, in the step that encodes its audio (vLLM's ``CrossAttentionSpec``
blocks), and every later step reads them.

Written here rather than taken from mlx-whisper: its modules read OpenAI's weight
names (checkpoints here are in the Hugging Face layout), its decoder keeps a
contiguous per-request cache the paged step cannot use, and the package pulls
numba, tiktoken and scipy. Weights: a ``WhisperForConditionalGeneration`` save
(``model.encoder.*``, ``model.decoder.*``; the head is the token embedding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from vllm_metal.attention.context import ForwardContext
from vllm_metal.ops.activations import gelu

if TYPE_CHECKING:
    from vllm_metal.backend import Backend


class UnsupportedWhisperError(ValueError):
    pass


@dataclass(frozen=True)
class WhisperConfig:
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    num_mel_bins: int
    max_source_positions: int
    max_target_positions: int
    vocab_size: int
    embed_scale: float

    @classmethod
    def from_dict(cls, config: dict) -> WhisperConfig:
        if config.get("model_type") != "whisper":
            raise UnsupportedWhisperError(f"model_type {config.get('model_type')!r} is not "
                                          "whisper")
        act = config.get("activation_function", "gelu")
        if act != "gelu":
            raise UnsupportedWhisperError(f"whisper: activation_function {act!r} is not "
                                          "served (gelu is)")
        d = config["d_model"]
        return cls(d, config["encoder_layers"], config["decoder_layers"],
                   config["encoder_attention_heads"], config["decoder_attention_heads"],
                   config["encoder_ffn_dim"], config["decoder_ffn_dim"],
                   config.get("num_mel_bins", 80), config["max_source_positions"],
                   config["max_target_positions"], config["vocab_size"],
                   d ** 0.5 if config.get("scale_embedding", False) else 1.0)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_heads


class _Attention(nn.Module):
    """Whisper's attention projections (no bias on the keys)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (d // heads) ** -0.5
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def split(self, x: mx.array) -> mx.array:
        """[rows, d] -> [rows, heads, head_dim]."""
        return x.reshape(x.shape[0], self.heads, -1)


class _Layer(nn.Module):
    """What an encoder and a decoder layer share: self-attention's projections and
    norm, and the pre-LN GELU MLP."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = _Attention(d, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def mlp(self, x: mx.array) -> mx.array:
        """x plus the MLP of its norm (the residual included)."""
        return x + self.fc2(gelu(self.fc1(self.final_layer_norm(x))))


class _EncoderLayer(_Layer):
    def __call__(self, x: mx.array) -> mx.array:
        """x [1, T, d] -> [1, T, d]."""
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        t = x.shape[1]

        def heads(y):   # [1, T, d] -> [1, H, T, hd]
            return y.reshape(1, t, a.heads, -1).transpose(0, 2, 1, 3)

        o = mx.fast.scaled_dot_product_attention(heads(a.q_proj(h)), heads(a.k_proj(h)),
                                                 heads(a.v_proj(h)), scale=a.scale)
        x = x + a.out_proj(o.transpose(0, 2, 1, 3).reshape(1, t, -1))
        return self.mlp(x)


class _Conv(nn.Module):
    """A width-3 convolution (padding 1) as one matrix product over the three shifted
    rows side by side, so it runs on the backend's linears: MLX's CPU convolution
    took 0.74 s of whisper-tiny's 1.6 s encoder for a 30-second clip here.
    Weight [out, 3 x in] (kernel position major), as load_whisper lays it out."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.proj = nn.Linear(3 * c_in, c_out)

    def __call__(self, x: mx.array) -> mx.array:
        """x [T, c_in] -> [ceil(T / stride), c_out]."""
        rows = -(-x.shape[0] // self.stride)
        padded = mx.pad(x, [(1, 1), (0, 0)])
        span = (rows - 1) * self.stride + 1
        taps = [padded[k:k + span:self.stride] for k in range(3)]
        return self.proj(mx.concatenate(taps, axis=-1))


class WhisperEncoder(nn.Module):
    def __init__(self, c: WhisperConfig) -> None:
        super().__init__()
        self.conv1 = _Conv(c.num_mel_bins, c.d_model, 1)
        self.conv2 = _Conv(c.d_model, c.d_model, 2)
        self.embed_positions = nn.Embedding(c.max_source_positions, c.d_model)
        self.layers = [_EncoderLayer(c.d_model, c.encoder_heads, c.encoder_ffn_dim)
                       for _ in range(c.encoder_layers)]
        self.layer_norm = nn.LayerNorm(c.d_model)

    def __call__(self, features: mx.array) -> mx.array:
        """features [num_mel_bins, 2 x max_source_positions] -> [max_source_positions, d]."""
        x = gelu(self.conv1(features.T))
        x = gelu(self.conv2(x))[None]
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)[0]


@dataclass
class CrossStep:
    """A decoder step's cross-attention inputs.

    tables:  int32 [total_q, max_blocks]: each row's request's cross block table
    lens:    int32 [total_q]: each row's request's encoder length
    encoded: [n, d] the encoder rows of the requests encoded this step (None: none)
    slots:   int32 [n]: the cross-cache slots they go to
    """

    tables: mx.array
    lens: mx.array
    encoded: mx.array | None = None
    slots: mx.array | None = None


class _DecoderLayer(_Layer):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__(d, heads, ffn)
        self.encoder_attn = _Attention(d, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(d)

    def __call__(self, x: mx.array, ctx: ForwardContext, entries: tuple[int, int],
                 cross: CrossStep) -> mx.array:
        """x [total_q, d] -> [total_q, d]; entries: (self, cross) KV entries."""
        own, other = entries
        a = self.self_attn
        h = self.self_attn_layer_norm(x)
        k, v = a.split(a.k_proj(h)), a.split(a.v_proj(h))
        ctx.write(own, k[:, :, None], v[:, :, None])
        o = ctx.attend(own, a.split(a.q_proj(h))[:, :, None], a.scale, None)
        x = x + a.out_proj(o.reshape(x.shape))

        c = self.encoder_attn
        if cross.encoded is not None:
            ctx.write_at(other, c.split(c.k_proj(cross.encoded)),
                         c.split(c.v_proj(cross.encoded)), cross.slots)
        q = c.split(c.q_proj(self.encoder_attn_layer_norm(x)))
        o = ctx.attend_all(other, q, cross.tables, cross.lens, c.scale)
        x = x + c.out_proj(o.reshape(x.shape))
        return self.mlp(x)


class WhisperDecoder(nn.Module):
    def __init__(self, c: WhisperConfig) -> None:
        super().__init__()
        self.embed_scale = c.embed_scale
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.embed_positions = nn.Embedding(c.max_target_positions, c.d_model)
        self.layers = [_DecoderLayer(c.d_model, c.decoder_heads, c.decoder_ffn_dim)
                       for _ in range(c.decoder_layers)]
        self.layer_norm = nn.LayerNorm(c.d_model)

    def __call__(self, input_ids: mx.array, positions: mx.array, ctx: ForwardContext,
                 cross: CrossStep) -> mx.array:
        """input_ids, positions int32 [total_q] -> final hidden [total_q, d]. Layer i
        keeps its own K/V in entry i and its cross K/V in entry decoder_layers + i."""
        x = self.embed_tokens(input_ids) * self.embed_scale + self.embed_positions(positions)
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, (i, n + i), cross)
        return self.layer_norm(x)

    def logits(self, hidden: mx.array) -> mx.array:
        """[R, d] -> [R, vocab] (the head is the token embedding)."""
        return self.embed_tokens.as_linear(hidden)


class WhisperModel(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = WhisperEncoder(config)
        self.decoder = WhisperDecoder(config)


def load_whisper(path: str | Path, dtype: mx.Dtype, backend: Backend | None = None
                 ) -> WhisperModel:
    """The Whisper checkpoint at ``path`` (Hugging Face layout), weights evaluated once,
    after ``backend.prepare_weights`` (its linears) when a backend is given."""
    path = Path(path)
    config = WhisperConfig.from_dict(json.loads((path / "config.json").read_text()))
    model = WhisperModel(config)
    weights = {}
    for file in sorted(path.glob("*.safetensors")):
        for key, value in mx.load(str(file)).items():
            key = key.removeprefix("model.")
            if key == "proj_out.weight":
                continue   # tied to the token embedding
            if key.startswith("encoder.conv"):   # _Conv's layout: [out, k x in]
                key = key.replace(".weight", ".proj.weight").replace(".bias", ".proj.bias")
                if value.ndim == 3:   # torch [out, in, k]
                    value = value.transpose(0, 2, 1).reshape(value.shape[0], -1)
            weights[key] = value
    model.load_weights(list(weights.items()), strict=True)
    model.set_dtype(dtype)
    if backend is not None:
        backend.prepare_weights(model)
    mx.eval(model.parameters())
    return model
