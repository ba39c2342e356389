"""mlx-lm's forward with the default CPU path's two roundings, written in MLX ops: the
reference for the default mode's parity tests.

The default path (int8 activations, a float16 KV cache; docs/configuration.md) is
not mlx-lm's arithmetic, and random tiny models amplify any rounding from layer
to layer (a 4-bit llama's logprobs move by nats), so holding it to mlx-lm's
float32 forward proves little. Here mlx-lm's own modules compute with the same
roundings, stated from their definition (csrc/cpu/linear/linear_q8.h), not from
our kernels:

- a quantized layer's input, per 32 columns, becomes q * d with d = max|x| / 127
  and q = round-half-even(x / d); the layer's output is
  sum_g scale * sum(code * x_rounded) + bias * sum(x) (the biases meet the exact
  sums of x);
- keys and values are rounded to float16 as they are written to the cache.

``emulating_default_path()`` patches mlx-lm's classes for the duration.
"""

from __future__ import annotations

import contextlib

import mlx.core as mx
import mlx.nn as nn

BLOCK = 32


def round_activations(x: mx.array) -> mx.array:
    """x [..., K] (K a multiple of 32) as the int8 kernels see it, float32."""
    x = x.astype(mx.float32)
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    amax = mx.abs(blocks).max(axis=-1, keepdims=True)
    inv = mx.where(amax > 0, 127.0 / amax, 0.0)
    q = mx.round(blocks * inv)
    return (q * (amax / 127.0)).reshape(x.shape)


def _codes_and_biases(module: nn.Module) -> tuple[mx.array, mx.array]:
    """W's scale * code part [..., N, K] and its biases [..., N, G], float32."""
    scales, biases = module["scales"], module["biases"]
    codes = mx.dequantize(module["weight"], scales, mx.zeros_like(biases),
                          group_size=module.group_size, bits=module.bits)
    return codes.astype(mx.float32), biases.astype(mx.float32)


def _group_sums(x: mx.array, group_size: int) -> mx.array:
    x = x.astype(mx.float32)
    return x.reshape(*x.shape[:-1], -1, group_size).sum(axis=-1)


def _int8_product(module: nn.Module, x: mx.array) -> mx.array:
    codes, biases = _codes_and_biases(module)
    return (round_activations(x) @ codes.T
            + _group_sums(x, module.group_size) @ biases.T)


def takes_int8(module: nn.Module) -> bool:
    """The layers the default path rounds: affine codes of 4 or 8 bits in groups of 32,
    64 or 128 (docs/configuration.md); others keep MLX's arithmetic there too."""
    return (getattr(module, "mode", "affine") == "affine" and module.bits in (4, 8)
            and module.group_size in (32, 64, 128) and module.get("biases") is not None)


def _switch(self, x, indices, sorted_indices=False):
    codes, biases = _codes_and_biases(self)
    y = mx.gather_mm(round_activations(x), codes.swapaxes(-1, -2), rhs_indices=indices,
                     sorted_indices=sorted_indices)
    y = y + mx.gather_mm(_group_sums(x, self.group_size), biases.swapaxes(-1, -2),
                         rhs_indices=indices, sorted_indices=sorted_indices)
    if "bias" in self:
        y = y + mx.expand_dims(self["bias"][indices], -2)
    return y


def _half(a: mx.array) -> mx.array:
    return a.astype(mx.float16).astype(a.dtype)


@contextlib.contextmanager
def emulating_default_path():
    """mlx-lm's affine-quantized layers and KV caches round as the default path does."""
    from mlx_lm.models import cache, switch_layers

    linear, as_linear = nn.QuantizedLinear.__call__, nn.QuantizedEmbedding.as_linear
    switch = switch_layers.QuantizedSwitchLinear
    original_switch = switch.__call__

    def linear_call(self, x):
        if not takes_int8(self):
            return linear(self, x)
        y = _int8_product(self, x)
        return y + self["bias"] if "bias" in self else y

    def embedding_as_linear(self, x):
        return _int8_product(self, x) if takes_int8(self) else as_linear(self, x)

    def switch_call(self, x, indices, sorted_indices=False):
        if not takes_int8(self):
            return original_switch(self, x, indices, sorted_indices)
        return _switch(self, x, indices, sorted_indices)

    patches = [(nn.QuantizedLinear, "__call__", linear_call),
               (nn.QuantizedEmbedding, "as_linear", embedding_as_linear),
               (switch, "__call__", switch_call)]
    for kind in {c for c in vars(cache).values()
                 if isinstance(c, type) and "update_and_fetch" in vars(c)
                 and c.__name__ in ("KVCache", "RotatingKVCache", "ChunkedKVCache")}:
        fetch = kind.update_and_fetch

        def rounded(self, keys, values, _fetch=fetch):
            return _fetch(self, _half(keys), _half(values))

        patches.append((kind, "update_and_fetch", rounded))
    saved = [(kind, name, vars(kind)[name]) for kind, name, _ in patches]
    try:
        for kind, name, fn in patches:
            setattr(kind, name, fn)
        yield
    finally:
        for kind, name, fn in saved:
            setattr(kind, name, fn)
