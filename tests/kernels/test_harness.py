"""The MSL CPU harness itself: exact simd_* semantics against numpy, and every
check it promises (poisoned threadgroup memory, lane orders, divergence and
early-exit reports, the out-of-bounds guard) caught on a planted bug."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.msl_harness import MslCompileError, MslLibrary, MslRuntimeError

PROBES = Path(__file__).parent / "msl"
ORDERS = ("forward", "reverse", "shuffled")


@pytest.fixture(scope="module")
def probe():
    return MslLibrary(PROBES / "harness_probe.metal")


def expected_collectives(x: np.ndarray) -> np.ndarray:
    """numpy model of the twelve collectives of harness_probe.metal, per simdgroup of 32."""
    out = np.zeros((x.size, 12), np.float64)
    for base in range(0, x.size, 32):
        v = x[base:base + 32].astype(np.float64)
        lanes = np.arange(32)
        o = out[base:base + 32]
        o[:, 0] = v[(lanes * 7) % 32]
        o[:, 1] = v[lanes ^ 5]
        o[:, 2] = np.where(lanes + 3 < 32, v[np.minimum(lanes + 3, 31)], v)
        o[:, 3] = np.where(lanes - 2 >= 0, v[np.maximum(lanes - 2, 0)], v)
        o[:, 4] = v[9]
        o[:, 5] = v.sum()
        o[:, 6] = v.max()
        o[:, 7] = v.min()
        o[:, 8] = np.concatenate([[0], np.cumsum(v)[:-1]])
        o[:, 9] = np.cumsum(v)
        o[:, 10] = float(sum(1 << i for i in range(32) if v[i] > 0))
        o[:, 11] = v[(lanes + 4) % 32]
    return out


@pytest.mark.parametrize("order", ORDERS)
def test_collectives_match_numpy(probe, order):
    # Small integers: every sum is exact, so any difference is a semantic one.
    x = np.random.default_rng(0).integers(-20, 20, 128).astype(np.float32)
    out = np.full(128 * 12, np.nan, np.float32)
    result = probe.dispatch("collectives", (2,), (64,), {0: x, 1: out}, order=order)
    np.testing.assert_array_equal(out.reshape(128, 12), expected_collectives(x).astype(np.float32))
    assert result.stats["collectives"] == 2 * 2 * 12  # per simdgroup, per collective call


def test_vector_collective_reduces_each_component(probe):
    x = np.random.default_rng(1).integers(-9, 9, (64, 4)).astype(np.float32)
    out = np.zeros_like(x)
    probe.dispatch("vector_sum", (1,), (64,), {0: x, 1: out})
    for base in (0, 32):
        np.testing.assert_array_equal(out[base:base + 32], np.broadcast_to(x[base:base + 32].sum(0), (32, 4)))


@pytest.mark.parametrize("order", ORDERS)
def test_barrier_orders_threadgroup_memory(probe, order):
    x = np.arange(128, dtype=np.float32)
    out = np.zeros(128, np.float32)
    probe.dispatch("threadgroup_reverse", (2,), (64,), {0: x, 1: out}, constants={0: True}, order=order)
    expected = np.concatenate([x[:64][::-1], x[64:][::-1]]) * 2
    np.testing.assert_array_equal(out, expected)


def test_missing_barrier_shows_as_lane_order_dependence(probe):
    x = np.arange(64, dtype=np.float32)
    results = []
    for order in ("forward", "reverse"):
        out = np.zeros(64, np.float32)
        probe.dispatch("missing_barrier", (1,), (64,), {0: x, 1: out}, order=order)
        results.append(out)
    assert not np.array_equal(results[0], results[1], equal_nan=True)
    assert np.isnan(results[0]).any()  # forward order reads slots not yet written: poison


def test_threadgroup_memory_starts_poisoned(probe):
    out = np.zeros(128, np.float32)
    probe.dispatch("unwritten_threadgroup_memory", (2,), (64,), {0: out})
    local = np.arange(128) % 64
    assert np.isnan(out[local < 32]).all()  # read slots 63..32, never written
    np.testing.assert_array_equal(out[local >= 32], 1.0)


def test_divergent_collective_is_reported_with_its_line(probe):
    out = np.zeros(32, np.float32)
    with pytest.raises(MslRuntimeError, match=r"(?s)divergent_collectives=1.*harness_probe.metal:\d+"):
        probe.dispatch("divergent_sum", (1,), (32,), {0: out})
    result = probe.dispatch("divergent_sum", (1,), (32,), {0: out}, strict=False)
    assert result.stats["divergent_collectives"] == 1
    np.testing.assert_array_equal(out[:16], 16.0)  # the active half summed only itself
    np.testing.assert_array_equal(out[16:], 1.0)


def test_barrier_after_early_return_is_reported(probe):
    out = np.zeros(64, np.float32)
    with pytest.raises(MslRuntimeError, match="(?s)early_exits=1.*after 14 lanes returned"):
        probe.dispatch("early_return", (1,), (64,), {0: out, 1: np.uint32(50)})


def test_shuffle_from_inactive_lane_is_reported(probe):
    out = np.zeros(32, np.float32)
    with pytest.raises(MslRuntimeError, match="inactive_lane_reads=8"):
        probe.dispatch("inactive_shuffle", (1,), (32,), {0: out})


def test_guard_names_the_buffer_and_thread_of_an_out_of_bounds_write(probe):
    out = np.zeros(100, np.float32)
    with pytest.raises(MslRuntimeError, match=r"buffer\(0\): 0 bytes past the end.*thread 100,0,0"):
        probe.dispatch("off_by_one", (4,), (32,), {0: out, 1: np.uint32(100)}, guard=True)
    probe.dispatch("off_by_one", (4,), (32,), {0: out, 1: np.uint32(99)}, guard=True)
    np.testing.assert_array_equal(out, 1.0)  # results come back from the guarded child


def test_function_constants_are_set_per_launch(probe):
    out = np.zeros(32, np.float32)
    probe.dispatch("function_constant_probe", (1,), (32,), {0: out}, constants={0: False})
    np.testing.assert_array_equal(out, 1.0)
    probe.dispatch("function_constant_probe", (1,), (32,), {0: out}, constants={0: True})
    np.testing.assert_array_equal(out, 2.0)
    probe.dispatch("function_constant_probe", (1,), (32,), {0: out})
    np.testing.assert_array_equal(out, -1.0)


def test_unbound_buffer_is_refused(probe):
    with pytest.raises(ValueError, match=r"buffers \[1\] are not bound"):
        probe.dispatch("collectives", (1,), (32,), {0: np.zeros(32, np.float32)})


def test_compile_errors_carry_the_compiler_message():
    with pytest.raises(MslCompileError, match="undeclared_value"):
        MslLibrary(PROBES / "does_not_compile.metal")
