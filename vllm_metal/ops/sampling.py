"""The sampler's last step as one lazy MLX node (CPU kernel of ``vllm_metal._ext``).

``sample_tokens`` picks one token per row: the argmax, or a draw from
softmax(logits / T) by the inverse CDF at one uniform per row, which the row's
key decides (the extension's ``debug.key_uniform`` computes it, for tests). On MLX's CPU backend this replaces Gumbel-max
(V uniforms and 2V logs per row, in scalar nodes). It is a CPU kernel: the
sampler routes through it only while MLX computes on the CPU (v1/sampler.py).
"""

from __future__ import annotations

import mlx.core as mx

from vllm_metal.native import get_ops
from vllm_metal.ops.linear import _CPU, _FLOAT_DTYPES, _array, _check_bitmask

__all__ = ["sample_tokens", "top_logprobs"]

_INT_DTYPES = (mx.int32, mx.int64)


def sample_tokens(logits: mx.array, temperature: mx.array, keys: mx.array, *,
                  min_p: mx.array | None = None, top_k: mx.array | None = None,
                  top_p: mx.array | None = None, allowed: mx.array | None = None) -> mx.array:
    """One token per row of ``logits``.

    logits:      float [R, V] (computed in float32)
    temperature: float [R]; > 0 draws from softmax(logits / T), <= 0 takes the
                 first index of the row's max
    keys:        uint32 [R, 2]; the draw is the smallest i whose cumulative
                 (filtered) probability exceeds the row's uniform (splitmix64 of keys[r])
    min_p:       float [R]: drop tokens below min_p x the row's top probability (0: off)
    top_k:       int [R]: keep the k most likely, ties kept (<= 0 or >= V: off)
    top_p:       float [R]: then keep the fewest most likely tokens holding top_p
                 of the remaining probability, ties kept (1: off)
    The filters act in that order (vLLM's) on rows with T > 0.
    allowed:     uint32 [R, >= ceil(V / 32)]: a grammar's bitmask (bit c % 32 of
                 word c / 32 admits token c); the tokens it does not admit count
                 as -inf logits, for the draw and the argmax alike
    Returns int32 [R], unevaluated. -inf logits are never drawn; a row with no
    finite or +inf logit gives 0.
    """
    for name, a in (("logits", logits), ("temperature", temperature), ("keys", keys)):
        _array(name, a)
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must be [R, V] with V >= 1, got shape {logits.shape}")
    if logits.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    rows = logits.shape[0]
    if temperature.shape != (rows,) or temperature.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"temperature must be a float array of shape ({rows},), got "
                         f"{temperature.dtype} {temperature.shape}")
    if keys.shape != (rows, 2) or keys.dtype != mx.uint32:
        raise ValueError(f"keys must be uint32 of shape ({rows}, 2), got {keys.dtype} "
                         f"{keys.shape}")
    for name, a, dtypes in (("min_p", min_p, _FLOAT_DTYPES), ("top_k", top_k, _INT_DTYPES),
                            ("top_p", top_p, _FLOAT_DTYPES)):
        if a is None:
            continue
        _array(name, a)
        if a.shape != (rows,) or a.dtype not in dtypes:
            raise ValueError(f"{name} must be an array of shape ({rows},) and dtype one of "
                             f"{', '.join(map(str, dtypes))}, got {a.dtype} {a.shape}")
    if allowed is not None:
        _check_bitmask("allowed", allowed, (rows,), logits.shape[1])
    return get_ops().sample_tokens(logits, temperature, keys, min_p, top_k, top_p,
                                   allowed=allowed, stream=_CPU)


def top_logprobs(x: mx.array, token: mx.array, k: int, normalize: bool
                 ) -> tuple[mx.array, mx.array, mx.array]:
    """The logprobs columns of each row of ``x``.

    x:         float [R, V] logits (computed in float32)
    token:     integer [R], each row's sampled or target token
    k:         top scores per row (>= 0)
    normalize: scores are log_softmax(x) (else x itself)
    Returns (ids int32 [R, k + 1], vals float32 [R, k + 1], ranks int32 [R]),
    unevaluated: column 0 is the token and its score, columns 1.. the k largest
    scores in descending order (ties: lower id first; id 0 and -inf past V);
    ranks count the scores >= the token's. A token outside [0, V) raises at
    evaluation.
    """
    for name, a in (("x", x), ("token", token)):
        _array(name, a)
    if x.ndim != 2 or x.shape[1] < 1 or x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"x must be a float array [R, V] with V >= 1, got {x.dtype} {x.shape}")
    if token.shape != (x.shape[0],) or not mx.issubdtype(token.dtype, mx.integer):
        raise ValueError(f"token must be an integer array of shape ({x.shape[0]},), got "
                         f"{token.dtype} {token.shape}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be an int >= 0, got {k!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {normalize!r}")
    ids, vals, ranks = get_ops().top_logprobs(x, token, k, normalize, stream=_CPU)
    return ids, vals, ranks

