"""Independent numpy float64 oracle for the paged ops: explicit per-token loops
over slots, written without reference to either implementation under test."""

from __future__ import annotations

import numpy as np


def paged_attention_np(
    query: np.ndarray,  # [total_q, H, D]
    key_cache: np.ndarray,  # [num_blocks, block_size, H_kv, D]
    value_cache: np.ndarray,
    block_tables: np.ndarray,  # [num_seqs, max_blocks]
    seq_lens: np.ndarray,  # [num_seqs]
    cu_seqlens_q: np.ndarray,  # [num_seqs + 1]
    scale: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,  # [H]
    key_ends: np.ndarray | None = None,  # [total_q]: a row also sees later keys before it
) -> np.ndarray:
    block_size = key_cache.shape[1]
    num_heads = query.shape[1]
    group = num_heads // key_cache.shape[2]
    out = np.zeros(query.shape, dtype=np.float64)
    for seq, ctx in enumerate(seq_lens):
        start, end = cu_seqlens_q[seq], cu_seqlens_q[seq + 1]
        for j, token in enumerate(range(start, end)):
            pos = ctx - (end - start) + j
            first = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            last = pos if key_ends is None else max(pos, min(key_ends[token], ctx) - 1)
            positions = range(first, last + 1)
            blocks = [block_tables[seq, t // block_size] for t in positions]
            offsets = [t % block_size for t in positions]
            for head in range(num_heads):
                kv = head // group
                keys = np.stack([key_cache[b, o, kv] for b, o in zip(blocks, offsets)])
                values = np.stack([value_cache[b, o, kv] for b, o in zip(blocks, offsets)])
                logits = keys @ query[token, head] * scale
                if softcap is not None:
                    logits = softcap * np.tanh(logits / softcap)
                top = logits.max() if sinks is None else max(logits.max(), sinks[head])
                weights = np.exp(logits - top)
                denominator = weights.sum()
                if sinks is not None:
                    denominator += np.exp(sinks[head] - top)
                out[token, head] = weights @ values / denominator
    return out


def reshape_and_cache_np(key, value, key_cache, value_cache, slot_mapping):
    """Copies of the caches with row i written at slot_mapping[i] (negative: skipped)."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    block_size = key_cache.shape[1]
    for i, slot in enumerate(slot_mapping):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[i]
            value_cache[slot // block_size, slot % block_size] = value[i]
    return key_cache, value_cache
