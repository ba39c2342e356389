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


def decode_steps(loaded, context: int, steps: int, batch: int = 1) -> tuple[list[float], int]:
    """Seconds of each of ``steps`` decode steps of ``batch`` sequences, each after its
    own ``context``-token prompt, and the graph nodes of one step. ``loaded``: a
    LoadedModel; the step is the paged forward (one row per sequence), the family's
    head on those rows and an argmax."""
    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context

    dims = loaded.dims
    per_seq = (context + steps) // BLOCK + 2
    cache = PagedKVCache(dims.num_layers, batch * per_seq + 1, BLOCK, dims.num_kv_heads,
                         dims.head_dim, mx.float32)
    tables = 1 + np.arange(batch * per_seq, dtype=np.int32).reshape(batch, per_seq)

    def step(rows: list[list[int]], start: int) -> mx.array:
        """rows: each sequence's new tokens (all the same count), from position start."""
        count = len(rows[0])
        pos = np.arange(start, start + count, dtype=np.int32)
        slots = np.concatenate([t[pos // BLOCK] * BLOCK + pos % BLOCK for t in tables])
        meta = AttentionMetadata(
            mx.array(np.tile(pos, len(rows))), mx.array(np.arange(len(rows) + 1) * count),
            mx.array([start + count] * len(rows)), [mx.array(tables[:len(rows)])],
            [mx.array(slots.astype(np.int32))])
        ids = mx.array([t for r in rows for t in r])
        with forward_context(ForwardContext(meta, cache.key_caches, cache.value_caches)):
            hidden = loaded.backbone(ids[None])[0]
        last = hidden.reshape(len(rows), count, -1)[:, -1]
        return mx.argmax(loaded.logits(last), axis=-1)

    prompts = [[(i * 37 + 11 * b) % 1000 + 10 for i in range(context)] for b in range(batch)]
    tokens = step(prompts, 0)
    mx.eval(tokens)
    probe = step([[t] for t in tokens.tolist()], context)  # the first timed step redoes this position
    nodes = graph_nodes(probe)
    mx.eval(probe)
    times = []
    for i in range(steps):
        begin = time.perf_counter()
        tokens = step([[t] for t in tokens.tolist()], context + i)
        mx.eval(tokens)
        times.append(time.perf_counter() - begin)
    return times, nodes
