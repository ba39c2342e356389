"""Logits transforms in MLX, in vLLM's order.

On raw float32 logits (`apply_processors`): grammar bitmask, allowed_token_ids,
bad_words, min_tokens, logit_bias, then repetition/frequency/presence penalties.
Then (`apply_sampling_filters`): temperature, min_p, top-k/top-p.
All logits are [R, V] float32; a masked token is -inf.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from vllm_metal.v1.sampling_batch import SamplingBatch, TokenPairs

_NEG_INF = float("-inf")


def scatter_mask(shape: tuple[int, int], pairs: TokenPairs) -> mx.array:
    """bool [R, V], True at each (row, token) pair."""
    rows, ids = pairs
    mask = mx.zeros(shape, dtype=mx.bool_)
    return mask.at[mx.array(rows), mx.array(ids)].add(True)


def grammar_bitmask_words(bitmask: np.ndarray) -> mx.array:
    """vLLM's int32 [R, W] grammar bitmask as the kernels take it: uint32 [R, W]."""
    return mx.array(np.ascontiguousarray(bitmask, dtype=np.int32).view(np.uint32))


def unpack_grammar_bitmask(bitmask: np.ndarray, vocab_size: int) -> mx.array:
    """int32 [R, ceil(V/32)] (bit j of word i allows token 32*i+j) -> bool [R, V] allowed."""
    words = grammar_bitmask_words(bitmask)
    bits = mx.right_shift(words[:, :, None], mx.arange(32, dtype=mx.uint32)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size] != 0


def apply_token_masks(logits: mx.array, batch: SamplingBatch,
                      grammar_bitmask: np.ndarray | None = None) -> mx.array:
    """Set every disallowed token to -inf: grammar, allowed_token_ids, bad_words, min_tokens.

    min_tokens bans the stop tokens, except in a row where that would leave no
    token at all (vLLM restores them there for grammar-constrained rows).
    """
    shape = logits.shape
    banned = None
    if grammar_bitmask is not None:
        banned = ~unpack_grammar_bitmask(grammar_bitmask, shape[1])
    if batch.allowed_tokens is not None:
        allowed = scatter_mask(shape, batch.allowed_tokens)
        not_allowed = mx.array(batch.allowed_rows)[:, None] & ~allowed
        banned = not_allowed if banned is None else banned | not_allowed
    if batch.banned_tokens is not None:
        bad = scatter_mask(shape, batch.banned_tokens)
        banned = bad if banned is None else banned | bad
    if banned is not None:
        logits = mx.where(banned, _NEG_INF, logits)
    if batch.stop_bans is not None:
        stopped = mx.where(scatter_mask(shape, batch.stop_bans), _NEG_INF, logits)
        dead = mx.all(stopped == _NEG_INF, axis=-1, keepdims=True)
        logits = mx.where(dead, logits, stopped)
    return logits


def apply_logit_bias(logits: mx.array, batch: SamplingBatch) -> mx.array:
    if batch.logit_bias is None:
        return logits
    rows, ids, values = batch.logit_bias
    return logits.at[mx.array(rows), mx.array(ids)].add(mx.array(values))


def apply_penalties(logits: mx.array, batch: SamplingBatch) -> mx.array:
    """Repetition (prompt + output tokens), then frequency and presence (output tokens)."""
    if batch.repetition_penalty is None:
        return logits
    shape = logits.shape
    counts = mx.zeros(shape, dtype=mx.float32)
    if batch.output_tokens is not None:
        rows, ids = batch.output_tokens
        counts = counts.at[mx.array(rows), mx.array(ids)].add(1.0)
    in_output = counts > 0
    rep = batch.repetition_penalty
    if (rep != 1.0).any():
        seen = in_output
        if batch.prompt_tokens is not None:
            seen = seen | scatter_mask(shape, batch.prompt_tokens)
        penalty = mx.where(seen, mx.array(rep)[:, None], 1.0)
        # Positive logits shrink and negative ones grow: both lower the token.
        logits = mx.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - mx.array(batch.frequency_penalty)[:, None] * counts
    return logits - mx.array(batch.presence_penalty)[:, None] * in_output


def apply_processors(logits: mx.array, batch: SamplingBatch,
                     grammar_bitmask: np.ndarray | None = None) -> mx.array:
    """Everything that acts on raw logits, greedy rows included."""
    logits = apply_token_masks(logits, batch, grammar_bitmask)
    logits = apply_logit_bias(logits, batch)
    return apply_penalties(logits, batch)


def apply_min_p(logits: mx.array, min_p: np.ndarray) -> mx.array:
    """Drop tokens with prob < min_p * max prob, i.e. logit < max logit + log(min_p)."""
    log_min_p = mx.log(mx.array(min_p))[:, None]  # min_p 0 -> -inf: keeps all
    floor = mx.max(logits, axis=-1, keepdims=True) + log_min_p
    return mx.where(logits < floor, _NEG_INF, logits)


# Top-p first looks at this many of each row's largest logits; it sorts the
# whole vocab only when they hold less than top_p of the mass.
TOP_P_CANDIDATES = 1024


def _thresholds(logits: mx.array, size: int, top_k: np.ndarray | None, k_active: np.ndarray,
                top_p: np.ndarray | None) -> tuple[mx.array, mx.array | None]:
    """Cut-off logit per row [R, 1] from the `size` largest logits of each row.

    Also returns, when size < V and top_p is set, bool [R]: whether those
    candidates decided the top-p cut exactly (they hold >= top_p of the mass).
    """
    num_rows, vocab = logits.shape
    partial = size < vocab
    ordered = mx.sort(mx.topk(logits, size, axis=-1) if partial else logits, axis=-1)
    threshold = mx.full((num_rows, 1), _NEG_INF)
    if k_active.any():
        kth = mx.take_along_axis(
            ordered, mx.array(np.where(k_active, size - top_k, 0))[:, None], axis=-1)
        threshold = mx.where(mx.array(k_active)[:, None], kth, threshold)
        ordered = mx.where(ordered < threshold, _NEG_INF, ordered)
    if top_p is None:
        return threshold, None

    lse = mx.logsumexp(ordered, axis=-1, keepdims=True)
    if partial:  # rows without top-k spread their mass over the whole vocab
        lse = mx.where(mx.array(k_active)[:, None], lse,
                       mx.logsumexp(logits, axis=-1, keepdims=True))
    cum = mx.cumsum(mx.exp(ordered - lse), axis=-1)
    mass = cum[:, -1:] if partial else 1.0
    # A token is dropped when the mass at or below it is <= 1 - top_p; the
    # largest token always survives.
    p = mx.array(top_p)[:, None]
    dropped = (cum <= mass - p).astype(mx.int32).sum(axis=-1, keepdims=True)
    p_cut = mx.take_along_axis(ordered, mx.minimum(dropped, size - 1), axis=-1)
    p_cut = mx.where(p < 1.0, p_cut, _NEG_INF)
    covered = ((p >= 1.0) | (mass >= p))[:, 0] if partial else None
    return mx.maximum(threshold, p_cut), covered


def apply_top_k_top_p(logits: mx.array, top_k: np.ndarray | None, top_p: np.ndarray | None,
                      candidates: int | None = TOP_P_CANDIDATES) -> mx.array:
    """Keep each row's top_k tokens, then its smallest prefix holding top_p of the mass.

    top_k int32 [R] (V = off), top_p float32 [R] (1 = off). Ties at the cut-off
    are all kept. With top_p, `candidates` (None = always sort the whole vocab)
    bounds the sort; if a row's candidates hold less than top_p of the mass the
    whole vocab is sorted after all, which needs one host sync.
    """
    vocab = logits.shape[1]
    k_active = top_k < vocab if top_k is not None else np.zeros(logits.shape[0], bool)
    k_max = int(top_k[k_active].max()) if k_active.any() else 0
    if top_p is None:
        size = k_max
    else:
        size = vocab if candidates is None else min(vocab, max(candidates, k_max))
    threshold, covered = _thresholds(logits, size, top_k, k_active, top_p)
    if covered is not None and not mx.all(covered).item():
        threshold, _ = _thresholds(logits, vocab, top_k, k_active, top_p)
    return mx.where(logits < threshold, _NEG_INF, logits)


def apply_sampling_filters(logits: mx.array, batch: SamplingBatch,
                           top_p_candidates: int | None = TOP_P_CANDIDATES) -> mx.array:
    """Temperature, then min_p, then top-k/top-p (greedy rows pass through)."""
    logits = logits / mx.array(batch.temperature)[:, None]
    if batch.min_p is not None:
        logits = apply_min_p(logits, batch.min_p)
    if batch.top_k is not None or batch.top_p is not None:
        logits = apply_top_k_top_p(logits, batch.top_k, batch.top_p, top_p_candidates)
    return logits
