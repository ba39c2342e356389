"""Run the extension's Metal launch plans on the MSL harness.

The plan (kernel names, grids, threadgroup sizes, function constants, the
parameter block as bytes) comes from the C++ dispatch layer, exactly what
eval_gpu encodes on a Mac; this module binds numpy copies of the inputs to the
kernels' [[buffer(n)]] slots and runs the launches in order. Outputs and
scratch start as NaN, so anything a kernel fails to write shows. Every run is
repeated under at least two lane orders and must agree bit for bit: a missing
barrier or a lane-order race would make them differ.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from tests.ops.paged_inputs import PagedBatch

NAN_BITS = {np.dtype(np.float32): np.uint32(0x7FC00000), np.dtype(np.float16): np.uint16(0x7E00),
            np.dtype(np.uint16): np.uint16(0x7FC0)}
DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}


def raw(a: mx.array) -> np.ndarray:
    """The array's bytes as numpy (bfloat16 as uint16 bit patterns)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16))
    return np.ascontiguousarray(np.array(a))


def as_float32(x: np.ndarray, dtype: mx.Dtype) -> np.ndarray:
    if dtype == mx.bfloat16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def nan_like(shape, like: np.ndarray) -> np.ndarray:
    out = np.empty(shape, like.dtype)
    out.view(np.uint8)[...] = 0xFF  # NaN for every float kind
    return out


def find_library(kernels: dict, name: str):
    for lib in kernels.values():
        if name in lib.kernels:
            return lib
    raise KeyError(f"no compiled kernels_v2 file has a kernel named {name!r}")


def query_lens(batch: PagedBatch) -> list[int]:
    cu = np.array(batch.cu_seqlens_q)
    return [int(x) for x in np.diff(cu)]


DEFAULT_ORDERS = ("forward", "reverse")


def check_orders(orders: tuple[str, ...]) -> None:
    if len(set(orders)) < 2:
        raise ValueError(f"run every kernel test under at least two lane orders, got {orders}")


def assert_same_bits(results: list[np.ndarray], orders: tuple[str, ...]) -> None:
    for order, result in zip(orders[1:], results[1:]):
        assert result.tobytes() == results[0].tobytes(), f"lane orders {orders[0]} and {order} disagree"


def run_paged_attention(kernels: dict, ext, batch: PagedBatch, route: str, *, partition_size: int = 512,
                        orders: tuple[str, ...] = DEFAULT_ORDERS, sliding_window: int | None = None,
                        softcap: float | None = None, sinks: mx.array | None = None,
                        guard: bool = False, kv_quant: int = 0,
                        key_ends: mx.array | None = None) -> tuple[np.ndarray, dict]:
    """(output as float32 [total_q, H, D], plan) of `route` run on the harness under
    each of `orders` (which must agree bit for bit). kv_quant > 0: the batch's
    caches are uint8 codes and scales (attention.kv_quant), read by the kernels
    of the query's dtype. key_ends int32 [total_q]: each row's key end (buffer 11)."""
    check_orders(orders)
    q, kc, vc = raw(batch.query), raw(batch.key_cache), raw(batch.value_cache)
    dtype = batch.query.dtype if kv_quant else batch.key_cache.dtype
    num_heads, head_size = q.shape[1], q.shape[2]
    plan = ext.debug.metal_launch_plan(
        [int(x) for x in np.array(batch.seq_lens)], query_lens(batch), num_heads, kc.shape[2], head_size,
        kc.shape[1], DTYPE_NAMES[dtype], route, partition_size=partition_size, scale=batch.scale,
        sliding_window=sliding_window or 0, softcap=softcap or 0.0, has_sinks=sinks is not None,
        max_blocks_per_seq=batch.block_tables.shape[1], kv_quant=kv_quant,
        has_key_ends=key_ends is not None)
    rows = max(plan["partial_rows"], 1)
    parts = plan["num_partitions"]
    outputs = []
    for order in orders:
        buffers = {
            0: q, 1: kc, 2: vc,
            3: np.array(batch.block_tables, np.int32), 4: np.array(batch.seq_lens, np.int32),
            5: np.array(batch.cu_seqlens_q, np.int32),
            6: np.array(sinks.astype(mx.float32)) if sinks is not None else np.zeros(1, np.float32),
            7: nan_like(q.shape, q),
            8: np.full((rows, num_heads, parts, 2), np.nan, np.float32),
            9: np.full((rows, num_heads, parts, head_size), np.nan, np.float32),
            10: plan["params"],
            11: np.array(key_ends, np.int32) if key_ends is not None else np.zeros(1, np.int32),
        }
        for launch in plan["launches"]:
            lib = find_library(kernels, launch["kernel"])
            lib.dispatch(launch["kernel"], launch["grid"], launch["threads"], buffers,
                         constants=launch["constants"], order=order, guard=guard)
        outputs.append(buffers[7])
    assert_same_bits(outputs, orders)
    return as_float32(outputs[0], dtype), plan


def run_reshape_and_cache(kernels: dict, ext, key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                          value_cache: np.ndarray, slots: np.ndarray, dtype_name: str, *,
                          orders: tuple[str, ...] = DEFAULT_ORDERS, guard: bool = False,
                          kv_quant: int = 0) -> None:
    """Write key/value rows into the caches (in place) with the planned launch, once
    per lane order on fresh copies (all must agree bit for bit). kv_quant > 0:
    uint8 caches of codes and scales; dtype_name is the rows' dtype."""
    check_orders(orders)
    num_tokens = key.shape[0]
    row = key.shape[1] * key.shape[2]
    plan = ext.debug.reshape_and_cache_plan(dtype_name, num_tokens, row, key_cache.shape[0] * key_cache.shape[1],
                                            kv_quant=kv_quant, head_size=key.shape[2])
    launch = plan["launch"]
    results = []
    for order in orders:
        caches = (key_cache.copy(), value_cache.copy())
        buffers = {0: key, 1: value, 2: caches[0], 3: caches[1], 4: slots.astype(np.int32), 5: plan["params"]}
        find_library(kernels, launch["kernel"]).dispatch(
            launch["kernel"], launch["grid"], launch["threads"], buffers, constants=launch["constants"],
            order=order, guard=guard)
        results.append(np.concatenate([caches[0].reshape(-1), caches[1].reshape(-1)]))
    assert_same_bits(results, orders)
    key_cache[...], value_cache[...] = caches
