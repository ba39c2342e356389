"""The per-step attention metadata the paged wrappers read.

The runner sets it around one forward (``with forward_context(meta):``); the
model never sees it, so mlx-lm model code runs unmodified.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx


@dataclass
class AttentionMetadata:
    """Metadata of one packed forward over ``total_q`` tokens of ``num_seqs`` requests.

    positions:     int32 [total_q]            position of each query token in its request
    cu_seqlens_q:  int32 [num_seqs + 1]       query-token offsets of each request
    seq_lens:      int32 [num_seqs]           context length including this step's tokens
    block_tables:  int32 [num_seqs, max_blocks]
    slot_mapping:  int32 [total_q]            cache slot of each new token
    """

    positions: mx.array
    cu_seqlens_q: mx.array
    seq_lens: mx.array
    block_tables: mx.array
    slot_mapping: mx.array


@dataclass
class ForwardContext:
    metadata: AttentionMetadata
    # Per layer [num_blocks, block_size, num_kv_heads, head_dim]; the wrappers
    # replace entries with the arrays reshape_and_cache returns.
    key_caches: list[mx.array]
    value_caches: list[mx.array]


_current: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError(
            "paged attention called outside a forward_context(): the model runner "
            "must set the step's metadata before calling the model")
    return _current
