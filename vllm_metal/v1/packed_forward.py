"""One packed varlen forward of a loaded model over a step's tokens, on a paged cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context

if TYPE_CHECKING:
    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.v1.input_batch import StepInputs
    from vllm_metal.v1.model_lifecycle import LoadedModel


def packed_forward(model: LoadedModel, step: StepInputs, cache: PagedKVCache,
                   states: dict | None = None, input_ids: mx.array | None = None,
                   state_slots: dict | None = None,
                   merged: tuple[np.ndarray, mx.array] | None = None) -> mx.array:
    """All of ``step``'s tokens through ``model`` -> final hidden [total_q, hidden]
    (lazy); the cache's entries are written as the graph runs. states: the model's
    recurrent-state entries (entry -> shape); state_slots: per state group, the
    (previous, current) state block of each request (hybrids only); input_ids int32
    [total_q] in place of step.input_ids (device-fed tokens); merged: (packed rows
    int32 [n], embeddings [n, hidden x (1 + levels)]) that replace those rows' token
    embeddings (a multimodal step's encoder outputs; the columns past ``hidden``
    are deepstack levels, models.deepstack)."""
    meta = AttentionMetadata(
        positions=mx.array(step.positions if step.mrope is None else step.mrope[0]),
        cu_seqlens_q=mx.array(step.cu_seqlens_q),
        seq_lens=mx.array(step.seq_lens),
        block_tables=[mx.array(t) for t in step.block_tables],
        slot_mapping=[mx.array(s) for s in step.slot_mapping],
        rope_angles=None if step.rope_angles is None else mx.array(step.rope_angles),
        key_ends=None if step.key_ends is None else mx.array(step.key_ends),
    )
    if state_slots is not None:
        slots: list[mx.array | None] = [None] * len(step.block_tables)
        for g, (_, cur) in state_slots.items():
            slots[g] = mx.array(cur)
        meta.state_slots = slots
        meta.has_state = mx.array(
            (step.positions[step.cu_seqlens_q[:-1]] > 0).astype(np.int32))
    ctx = ForwardContext(meta, cache.key_caches, cache.value_caches, cache.groups,
                         states or {}, kv_quant=cache.quant, key_columns=cache.key_columns)
    with forward_context(ctx):
        if input_ids is None:
            input_ids = mx.array(step.input_ids)
        if merged is None:
            return model.backbone(input_ids[None])[0]
        rows, features = merged
        rows = mx.array(rows)
        embeddings = model.adapter.backbone.embed_tokens(input_ids)
        hidden = embeddings.shape[-1]
        if features.shape[-1] > hidden:   # deepstack levels after the merged rows
            levels = features[:, hidden:].reshape(len(rows), -1, hidden)
            ctx.deepstack = (rows, levels.transpose(1, 0, 2))
            features = features[:, :hidden]
        embeddings[rows] = features.astype(embeddings.dtype)
        return model.backbone(input_ids[None], embeddings)[0]
