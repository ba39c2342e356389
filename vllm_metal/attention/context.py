"""The per-step attention state the model's caches read (``LayerCache``).

The runner sets it around one forward (``with forward_context(ctx):``); the
model never sees it, so mlx-lm model code runs unmodified.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx

from vllm_metal import envs, ops
from vllm_metal.attention.caches.state_pages import GdnStateShape
from vllm_metal.attention.kv_quant import KvQuant
from vllm_metal.ops import gdn
from vllm_metal.ops.mla import latent_cache_write, mla_attention


@dataclass
class AttentionMetadata:
    """Metadata of one packed forward over ``total_q`` tokens of ``num_seqs`` requests.

    positions:     int32 [total_q]            position of each query token in its request
    cu_seqlens_q:  int32 [num_seqs + 1]       query-token offsets of each request
    seq_lens:      int32 [num_seqs]           context length including this step's tokens
    block_tables:  per KV cache group, int32 [num_seqs, max_blocks]
    slot_mapping:  per KV cache group, int32 [total_q]  cache slot of each new token
    state_slots:   per KV cache group of state entries, int32 [num_seqs]: the block
                   holding each request's recurrent state (None for attention groups)
    has_state:     int32 [num_seqs]: 1 where the request continues a state (its
                   first row is not position 0)
    rope_angles:   float32 [2, total_q, rope_dims / 2]: cos and sin of each row's
                   rotary angles, for models whose rotation is not one position per
                   row (M-RoPE, models.mrope); positions then hold the time axis
    key_ends:      int32 [total_q]: rows of an image span that attends bidirectionally
                   (a prefix-LM's, such as Gemma 3) name one past the span's last
                   position, every other row 0 (ops.paged_attention's key_ends)

    vLLM's hybrid cache gives full and sliding-window layers their blocks in
    separate groups; a model with one kind of layer has one group.
    """

    positions: mx.array
    cu_seqlens_q: mx.array
    seq_lens: mx.array
    block_tables: list[mx.array]
    slot_mapping: list[mx.array]
    state_slots: list[mx.array | None] | None = None
    has_state: mx.array | None = None
    rope_angles: mx.array | None = None
    key_ends: mx.array | None = None


@dataclass
class ForwardContext:
    """One packed forward: its metadata and the paged caches of every KV entry.

    The model's tokens are ``total_q`` rows of one token each: K/V arrive as
    [total_q, num_kv_heads, 1, head_dim] and queries as [total_q, num_heads, 1, head_dim].
    """

    metadata: AttentionMetadata
    # Per KV entry [num_blocks, block_size, num_kv_heads, head_dim]; write()
    # replaces entries with the arrays reshape_and_cache returns.
    key_caches: list[mx.array]
    value_caches: list[mx.array]
    # Per KV entry, its KV cache group (index into the metadata's tables); None: all 0.
    groups: list[int] | None = None
    # State (Gated DeltaNet) entries: where their state sits in their K/V pages.
    states: dict[int, GdnStateShape] = field(default_factory=dict)
    # The caches' quantized format (attention.kv_quant), or None: float caches.
    kv_quant: KvQuant | None = None
    # Key caches [num_blocks, num_kv_heads, head_dim, block_size] (PagedKVCache.key_columns).
    key_columns: bool = False
    # id(keys handed back by write) -> (entry, keys): layers that reuse another
    # layer's K/V (Gemma 4's shared-KV layers) attend with no cache of their own.
    _written: dict[int, tuple[int, mx.array]] = field(default_factory=dict)
    # (packed rows int32 [n], rows to add float [levels, n, hidden]): a step's image
    # rows that the first decoder layers add to (models.deepstack); None without.
    deepstack: tuple[mx.array, mx.array] | None = None

    def write(self, entry: int, keys: mx.array, values: mx.array) -> None:
        """Store this step's K/V rows of KV entry ``entry``."""
        k, v = _rows(keys, "keys", entry), _rows(values, "values", entry)
        self.key_caches[entry], self.value_caches[entry] = ops.reshape_and_cache(
            k, v, self.key_caches[entry], self.value_caches[entry],
            self.metadata.slot_mapping[self.group_of(entry)], kv_quant=self.kv_quant,
            key_columns=self.key_columns)
        self._written[id(keys)] = (entry, keys)

    def write_at(self, entry: int, keys: mx.array, values: mx.array, slots: mx.array) -> None:
        """Store K/V rows [n, num_kv_heads, head_dim] of KV entry ``entry`` at ``slots``
        int32 [n] (rows that are not this step's tokens: an encoder's, for
        cross-attention)."""
        self.key_caches[entry], self.value_caches[entry] = ops.reshape_and_cache(
            keys, values, self.key_caches[entry], self.value_caches[entry], slots,
            kv_quant=self.kv_quant, key_columns=self.key_columns)

    def attend_all(self, entry: int, queries: mx.array, block_tables: mx.array,
                   seq_lens: mx.array, scale: float) -> mx.array:
        """queries [total_q, num_heads, D] -> [total_q, num_heads, D]: each row over
        every key of its own table row (block_tables int32 [total_q, max_blocks],
        seq_lens int32 [total_q]), unmasked: cross-attention to an encoder's rows.
        Each row is a one-token sequence at the last position of its keys."""
        rows = mx.arange(queries.shape[0] + 1, dtype=mx.int32)
        return ops.paged_attention(queries, self.key_caches[entry], self.value_caches[entry],
                                   block_tables, seq_lens, rows, scale,
                                   kv_quant=self.kv_quant, key_columns=self.key_columns)

    def write_latent(self, entry: int, latent: mx.array, k_pe: mx.array) -> None:
        """Store this step's latent rows of MLA entry ``entry``: latent [total_q, rank],
        k_pe [total_q, rope_dim] into its cache [num_blocks, block_size, 1, rank + rope_dim]."""
        cache = self.key_caches[entry]
        flat = cache.reshape(cache.shape[0], cache.shape[1], cache.shape[3])
        written = latent_cache_write(latent, k_pe, flat,
                                         self.metadata.slot_mapping[self.group_of(entry)])
        self.key_caches[entry] = written.reshape(cache.shape)

    def attend_latent(self, entry: int, q_latent: mx.array, q_pe: mx.array,
                      scale: float) -> mx.array:
        """q_latent [total_q, H, rank], q_pe [total_q, H, rope_dim] -> [total_q, H, rank]:
        weight-absorbed MLA over entry's latent cache."""
        cache = self.key_caches[entry]
        meta = self.metadata
        return mla_attention(
            q_latent, q_pe, cache.reshape(cache.shape[0], cache.shape[1], cache.shape[3]),
            meta.block_tables[self.group_of(entry)], meta.seq_lens, meta.cu_seqlens_q, scale)

    def short_conv(self, entry: int, index: int, x: mx.array, weight: mx.array) -> mx.array:
        """x [total_q, C], weight [C, K] -> [total_q, C]: state entry ``entry``'s short
        conv ``index``, each request continuing from (and updating) its page."""
        meta = self.metadata
        lo = _float_rows(self.key_caches[entry])
        y, lo = gdn.short_conv(x, weight, lo, meta.state_slots[self.group_of(entry)],
                               meta.cu_seqlens_q, meta.has_state,
                               conv_offset=self.states[entry].conv_offset(index))
        self.key_caches[entry] = _from_float_rows(lo, self.key_caches[entry])
        return y

    def gated_delta(self, entry: int, q: mx.array, k: mx.array, v: mx.array, g: mx.array,
                    beta: mx.array, delta: bool = True) -> mx.array:
        """q, k [total_q, Hk, Dk], v [total_q, Hv, Dv], g [total_q, Hv(, Dk)], beta
        [total_q, Hv] -> [total_q, Hv, Dv]: state entry ``entry``'s recurrence (the
        delta rule, or the linear rule of a Mamba2 SSM: ops.gdn.gated_delta)."""
        meta = self.metadata
        shape = self.states[entry]
        lo, hi = _float_rows(self.key_caches[entry]), _float_rows(self.value_caches[entry])
        y, lo, hi = gdn.gated_delta(q, k, v, g, beta, lo, hi,
                                    meta.state_slots[self.group_of(entry)], meta.cu_seqlens_q,
                                    meta.has_state, shape.ssm_offset,
                                    shape.heads_in_lo(lo.shape[1]), delta=delta,
                                    chunk=envs.VLLM_METAL_GDN_PREFILL_CHUNK)
        self.key_caches[entry] = _from_float_rows(lo, self.key_caches[entry])
        self.value_caches[entry] = _from_float_rows(hi, self.value_caches[entry])
        return y

    def group_of(self, entry: int) -> int:
        return 0 if self.groups is None else self.groups[entry]

    def entry_of(self, keys: mx.array) -> int | None:
        """The KV entry whose write() returned ``keys``, if any."""
        found = self._written.get(id(keys))
        return found[0] if found is not None and found[1] is keys else None

    def attend(self, entry: int, queries: mx.array, scale: float, window: int | None,
               softcap: float | None = None, sinks: mx.array | None = None) -> mx.array:
        """queries [total_q, num_heads, 1, D] -> [total_q, num_heads, 1, D] over entry's cache."""
        q = _rows(queries, "queries", entry)
        meta = self.metadata
        out = ops.paged_attention(
            q, self.key_caches[entry], self.value_caches[entry],
            meta.block_tables[self.group_of(entry)], meta.seq_lens, meta.cu_seqlens_q, scale,
            sliding_window=window, softcap=softcap, sinks=sinks, kv_quant=self.kv_quant,
            key_columns=self.key_columns, key_ends=meta.key_ends)
        return out[:, :, None, :]


def _float_rows(cache: mx.array) -> mx.array:
    """[num_blocks, block_size, H, D] of any dtype -> float32 [num_blocks, half_floats]
    over the same bytes."""
    return cache.view(mx.float32).reshape(cache.shape[0], -1)


def _from_float_rows(rows: mx.array, like: mx.array) -> mx.array:
    """_float_rows undone: ``rows`` back in ``like``'s shape and dtype."""
    return rows.view(like.dtype).reshape(like.shape)


def _rows(x: mx.array, name: str, entry: int) -> mx.array:
    """[total_q, heads, 1, D] -> [total_q, heads, D]; anything else is a layout the
    paged path does not know (the family reshaped its tokens its own way)."""
    if x.ndim != 4 or x.shape[2] != 1:
        raise ValueError(
            f"KV entry {entry}: {name} of shape {tuple(x.shape)} are not one token per "
            "row [total_q, heads, 1, head_dim]")
    return x.reshape(x.shape[0], x.shape[1], x.shape[3])


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


def in_forward() -> bool:
    return _current is not None
