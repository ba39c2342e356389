"""Decode step of a hybrid (Gated DeltaNet + full attention) model at short and long
context: the linear-attention layers' cost must not grow with the context, and the
full-attention layers' share is reported.

The model is a random-weight Qwen3-Next-shaped checkpoint built by mlx-lm's own class
(3 GDN layers to 1 full-attention layer; full attention 8 query / 2 KV heads of 256,
GDN 8 key / 16 value heads of 128 with a 4-tap conv, as Qwen3-Next's per-layer shapes
at half the heads), float32, dense MLPs, loaded as the server loads it (CPU backend).
Each context is a prompt fed in 2048-token chunks (the state carried across them),
then single-sequence decode steps through the runner's forward; the median step is
reported, with the time of the paged ops alone for one layer of each kind at that
context (attention: ops.paged_attention over the context; GDN: ops.gdn.short_conv and
ops.gdn.gated_delta on the state) times the layer counts.

Then the time to first token of a long prompt through vllm.LLM with prefix caching on,
cold, on a prefix hit, and cold with the recurrences in the chunked form.

    .venv/bin/python benchmarks/bench_hybrid.py [--contexts 1024,16384] [--steps 16]
        [--ttft-context 8192]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, LAYERS, VOCAB = 1024, 12, 8192
SHAPE = dict(num_attention_heads=8, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_conv_kernel_dim=4)
CHUNK = 2048


def build(path: Path) -> None:
    from tests.family_models import make_family_model

    make_family_model(path, "qwen3_next", hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      full_attention_interval=4, intermediate_size=2816, vocab_size=VOCAB,
                      num_experts=0, max_position_embeddings=32768, **SHAPE)


def _median(fn, repeats: int) -> float:
    mx.eval(fn())
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2]


def measure(loaded, context: int, steps: int) -> dict:
    from vllm_metal import ops
    from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
    from vllm_metal.attention.caches.state_pages import block_size_for_states
    from vllm_metal.attention.context import AttentionMetadata, ForwardContext, forward_context
    from vllm_metal.ops import gdn

    dims = loaded.dims
    entries = loaded.adapter.entries
    states = {i: e.state for i, e in enumerate(entries) if e.state is not None}
    block = block_size_for_states(list(states.values()), dims.num_kv_heads, dims.head_dim, 4, 32)
    blocks = (context + steps) // block + 2
    cache = PagedKVCache(dims.num_layers, blocks + 1, block, dims.num_kv_heads, dims.head_dim,
                         mx.float32)
    table = np.arange(1, blocks + 1, dtype=np.int32)[None]
    state_block = blocks   # the last block: no K/V there

    def step(ids: list[int], start: int) -> mx.array:
        pos = np.arange(start, start + len(ids), dtype=np.int32)
        meta = AttentionMetadata(
            mx.array(pos), mx.array([0, len(ids)], dtype=mx.int32),
            mx.array([start + len(ids)], dtype=mx.int32), [mx.array(table)],
            [mx.array(table[0, pos // block] * block + pos % block)],
            state_slots=[mx.array([state_block], dtype=mx.int32)],
            has_state=mx.array([int(start > 0)], dtype=mx.int32))
        ctx = ForwardContext(meta, cache.key_caches, cache.value_caches, states=states)
        with forward_context(ctx):
            hidden = loaded.backbone(mx.array(ids, dtype=mx.int32)[None])[0]
        return mx.argmax(loaded.logits(hidden[-1:]), axis=-1)

    prompt = [(i * 37) % (VOCAB - 10) + 10 for i in range(context)]
    begin = time.perf_counter()
    for lo in range(0, context, CHUNK):
        token = step(prompt[lo:lo + CHUNK], lo)
        mx.eval(token)
    prefill = time.perf_counter() - begin
    times = []
    for i in range(steps):
        begin = time.perf_counter()
        token = step([int(token.item())], context + i)
        mx.eval(token)
        times.append(time.perf_counter() - begin)

    # The paged ops alone, one layer of each kind, at this context.
    attn = next(e for e in entries if e.state is None)
    q = mx.random.normal((1, attn.num_heads, dims.head_dim))
    lens = mx.array([context + 1], dtype=mx.int32)
    cu = mx.array([0, 1], dtype=mx.int32)
    full = next(i for i, e in enumerate(entries) if e.state is None)
    attention = _median(lambda: ops.paged_attention(
        q, cache.key_caches[full], cache.value_caches[full], mx.array(table), lens, cu,
        attn.scale), 9)
    st = next(iter(states.values()))
    lo_rows = cache.key_caches[0].reshape(blocks + 1, -1)
    hi_rows = cache.value_caches[0].reshape(blocks + 1, -1)
    slots = mx.array([state_block], dtype=mx.int32)
    one = mx.array([1], dtype=mx.int32)
    hk = SHAPE["linear_num_key_heads"]
    x = mx.random.normal((1, st.conv_dim))
    w = mx.random.normal((st.conv_dim, st.conv_kernel)) * 0.3
    qk = mx.random.normal((1, hk, st.head_k_dim)) * st.head_k_dim ** -0.5
    v = mx.random.normal((1, st.num_v_heads, st.head_v_dim))
    g = mx.full((1, st.num_v_heads), 0.9)
    beta = mx.full((1, st.num_v_heads), 0.5)

    def gdn_ops():
        y, lo = gdn.short_conv(x, w, lo_rows, slots, cu, one)
        out, lo, hi = gdn.gated_delta(qk, qk, v, g, beta, lo, hi_rows, slots, cu, one,
                                      st.ssm_offset, st.heads_in_lo(lo_rows.shape[1]))
        return y, out
    linear = _median(gdn_ops, 9)
    n_attn = sum(e.state is None for e in entries)
    return dict(context=context, block=block, prefill_s=prefill,
                step_ms=1e3 * sorted(times)[len(times) // 2],
                attention_ms=1e3 * attention * n_attn, gdn_ms=1e3 * linear * len(states),
                attention_layers=n_attn, gdn_layers=len(states))


def ttft(path: Path, context: int) -> tuple[float, float, float]:
    """Seconds to the first token of a ``context``-token prompt through vllm.LLM with
    prefix caching on: cold, then for a prompt sharing all but its last 16 tokens (a
    prefix hit: the cached blocks' attention rows and the recurrent state at the last
    cached block boundary are reused), then cold again with the GDN layers in the
    chunked form (VLLM_METAL_GDN_PREFILL_CHUNK=64, read at each call)."""
    import os

    # The engine in this process: a forked engine core would inherit MLX's threads.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(str(path), max_model_len=context + 64, enable_prefix_caching=True,
              max_num_batched_tokens=CHUNK, max_num_seqs=1, gpu_memory_utilization=0.5)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    prompt = [(i * 37) % (VOCAB - 10) + 10 for i in range(context)]
    other = prompt[:-16] + [(i * 53) % (VOCAB - 10) + 10 for i in range(16)]
    times = []
    for ids, chunk in ((prompt, "0"), (other, "0"), (prompt, "64")):
        os.environ["VLLM_METAL_GDN_PREFILL_CHUNK"] = chunk
        if len(times) == 2:
            llm.reset_prefix_cache()    # the chunked run starts cold too
        begin = time.perf_counter()
        llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        times.append(time.perf_counter() - begin)
    del os.environ["VLLM_METAL_GDN_PREFILL_CHUNK"]
    del llm
    return times[0], times[1], times[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="1024,16384")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--ttft-context", type=int, default=8192,
                        help="prompt length of the prefix-cache TTFT measure (0: skip)")
    args = parser.parse_args()
    from vllm_metal.cpu.backend import CpuBackend
    from vllm_metal.v1.model_lifecycle import load_model, parameter_bytes

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hybrid"
        build(path)
        loaded = load_model(str(path), mx.float32, CpuBackend())
        print(f"qwen3_next-shaped, {parameter_bytes(loaded.model) / 2**20:.0f} MiB float32, "
              f"{LAYERS} layers")
        print("| context | block | prefill s | decode step ms | full attention (ops) ms "
              "| GDN (ops) ms | attention share of step |")
        print("|---|---|---|---|---|---|---|")
        for context in (int(c) for c in args.contexts.split(",")):
            r = measure(loaded, context, args.steps)
            print(f"| {r['context']} | {r['block']} | {r['prefill_s']:.1f} | "
                  f"{r['step_ms']:.2f} | {r['attention_ms']:.3f} ({r['attention_layers']} "
                  f"layers) | {r['gdn_ms']:.3f} ({r['gdn_layers']} layers) | "
                  f"{r['attention_ms'] / r['step_ms']:.0%} |")
        del loaded
        if args.ttft_context:
            cold, hit, chunked = ttft(path, args.ttft_context)
            print(f"\nTTFT of a {args.ttft_context}-token prompt, prefix caching on: cold "
                  f"{cold:.2f} s, prefix hit (all but the last 16 tokens cached) {hit:.2f} s, "
                  f"cold with VLLM_METAL_GDN_PREFILL_CHUNK=64 {chunked:.2f} s")


if __name__ == "__main__":
    main()
