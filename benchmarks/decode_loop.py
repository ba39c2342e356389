"""Time single-sequence decode steps of a loaded model through the runner's forward."""

from __future__ import annotations

import io
import time

import mlx.core as mx
import numpy as np

BLOCK = 16


def graph_nodes(output: mx.array) -> int:
    """Nodes of the lazy graph behind ``output`` (what MLX's CPU scheduler enqueues)."""
    dot = io.StringIO()
    mx.export_to_dot(dot, output)
    return sum(1 for line in dot.getvalue().splitlines() if "shape=rectangle" in line)


def decode_steps(loaded, context: int, steps: int) -> tuple[list[float], int]:
    """Seconds of each of ``steps`` decode steps after a ``context``-token prompt, and
    the graph nodes of one step. ``loaded``: a LoadedModel; the step is the paged
    forward, the family's head on the last row and an argmax."""
    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context

    dims = loaded.dims
    blocks = (context + steps) // BLOCK + 2
    cache = PagedKVCache(dims.num_layers, blocks + 1, BLOCK, dims.num_kv_heads, dims.head_dim,
                         mx.float32)
    table = np.arange(1, blocks + 1, dtype=np.int32)[None]

    def step(ids: list[int], start: int) -> mx.array:
        pos = np.arange(start, start + len(ids), dtype=np.int32)
        slots = (table[0][pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
        meta = AttentionMetadata(mx.array(pos), mx.array([0, len(ids)]),
                                 mx.array([start + len(ids)]), [mx.array(table)],
                                 [mx.array(slots)])
        with forward_context(ForwardContext(meta, cache.key_caches, cache.value_caches)):
            hidden = loaded.backbone(mx.array(ids)[None])[0]
        return mx.argmax(loaded.logits(hidden[-1:]), axis=-1)

    token = step([(i * 37) % 1000 + 10 for i in range(context)], 0)
    mx.eval(token)
    probe = step([token.item()], context)   # the first timed step redoes this position
    nodes = graph_nodes(probe)
    mx.eval(probe)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        token = step([token.item()], context + i)
        mx.eval(token)
        times.append(time.perf_counter() - start)
    return times, nodes
