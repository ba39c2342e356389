"""The int8 matmuls' AMX tiles (csrc/cpu/linear/linear_q8_vnni.cpp, gemm_amx):
every whole 16 rows of x multiply on tdpbsud where the CPU has AMX-INT8, and
each output must be the bits the AVX512-VNNI kernel gives it (exact integer
dots, then the same float steps in the same order), which test_linear_q8.py
checks against the float64 oracle. Skipped where the CPU or OS has no AMX."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.linear_inputs import make_quantized, random_float
from tests.ops.test_linear_q8 import assert_q8_close
from tests.ops.test_linear_q8_tiles import bits_of, product
from vllm_metal.native import get_ops

# Calls with fewer rows take the VNNI kernel even where AMX is on.
MIN_ROWS = get_ops().debug.AMX_MIN_ROWS


def require_amx() -> None:
    """Skip where the AMX kernel cannot run (the switch is left as it was)."""
    ext = get_ops()
    if ext.cpu_isa() != "avx512":
        pytest.skip("the AMX kernel sits beside the AVX-512 one")
    original = ext.cpu_amx()
    try:
        ext.debug.set_cpu_amx(True)
    except ValueError:
        pytest.skip("this CPU or OS offers no AMX-INT8 tiles")
    ext.debug.set_cpu_amx(original)


@contextmanager
def amx(on: bool):
    """Run the int8 matmuls with AMX tiles on or off (skips where there are none)."""
    require_amx()
    ext = get_ops()
    original = ext.cpu_amx()
    try:
        ext.debug.set_cpu_amx(on)
        yield
    finally:
        ext.debug.set_cpu_amx(original)


def both(x, q, **kw) -> tuple[np.ndarray, np.ndarray]:
    """(bits with AMX, bits without) of one product."""
    with amx(True):
        assert get_ops().cpu_amx()
        tiles = bits_of(product(x, q, **kw))
    with amx(False):
        assert not get_ops().cpu_amx()
        vnni = bits_of(product(x, q, **kw))
    return tiles, vnni


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("tiled", [False, True])
def test_tiles_give_the_bits_of_vnni(bits, group_size, scale_dtype, tiled):
    # N = 45: two whole tiles of W and a partial one; M: whole AMX blocks of 16
    # rows and 5 rows for the VNNI kernel; K off the 128-column chunk grid.
    q = make_quantized(45, 384, bits, group_size, scale_dtype, seed=bits + group_size)
    x = random_float((MIN_ROWS + 5, 384), seed=7)
    tiles, vnni = both(x, q, tiled=tiled)
    assert np.array_equal(tiles, vnni)
    with amx(True):
        assert_q8_close(product(x, q, tiled=tiled), x, q)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("tiled", [False, True])
def test_symmetric_weights(bits, tiled):
    q = make_quantized(40, 256, bits, 32, mx.float16, seed=11)
    x = random_float((MIN_ROWS, 256), seed=2)
    tiles, vnni = both(x, q, tiled=tiled, symmetric=True)
    assert np.array_equal(tiles, vnni)


def test_panels_of_rows():
    # K = 4096 makes a panel 256 rows (1 MiB of activations): 300 rows are a
    # whole panel, a partial one of 32 and 12 rows for VNNI, so every tile's
    # codes are widened twice.
    q = make_quantized(40, 4096, 4, 64, mx.float16, seed=3)
    x = random_float((300, 4096), seed=4)
    tiles, vnni = both(x, q, tiled=True)
    assert np.array_equal(tiles, vnni)
    with amx(True):
        assert_q8_close(product(x, q, tiled=True), x, q)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_gives_the_same_bits_alone_and_among_tiles(bits):
    # Alone a row takes the VNNI kernel; among MIN_ROWS or more, AMX (the rows
    # past the last whole 16, VNNI).
    q = make_quantized(64, 576, bits, 32, mx.float16, seed=bits)
    rows = MIN_ROWS + 33
    x = random_float((rows, 576), seed=5)
    perm = np.random.default_rng(1).permutation(rows)
    with amx(True):
        full = bits_of(product(x, q, tiled=True))
        for i in (0, 15, 16, MIN_ROWS, rows - 1):
            alone = bits_of(product(x[i:i + 1], q, tiled=True))
            assert np.array_equal(alone[0], full[i]), f"row {i} alone"
        for m in (MIN_ROWS - 1, MIN_ROWS, MIN_ROWS + 1, MIN_ROWS + 16, MIN_ROWS + 17):
            assert np.array_equal(bits_of(product(x[:m], q, tiled=True)), full[:m]), m
        shuffled = bits_of(product(x[mx.array(perm)], q, tiled=True))
        assert np.array_equal(shuffled, full[perm])


def test_extreme_activations_and_codes():
    # Codes at their ends (0 and 15 / 255) against activations at +-127 and
    # zero blocks: the dots' largest magnitudes, and a block whose step is 0.
    q = make_quantized(32, 256, 8, 32, mx.float32, seed=6)
    w = mx.where(mx.arange(q.w.size).reshape(q.w.shape) % 2 == 0,
                 mx.array(0xFFFFFFFF, dtype=mx.uint32), mx.array(0, dtype=mx.uint32))
    q.w = w
    x = random_float((MIN_ROWS, 256), seed=8, scale=100.0)
    x = mx.concatenate([x[:, :64] * 0, mx.sign(x[:, 64:]) * 1e4], axis=1)
    tiles, vnni = both(x, q, tiled=False)
    assert np.array_equal(tiles, vnni)
    with amx(True):
        assert_q8_close(product(x, q, tiled=False), x, q)


def test_switch_refuses_where_there_are_no_tiles():
    ext = get_ops()
    try:
        ext.debug.set_cpu_amx(True)
    except ValueError as e:
        assert "AMX" in str(e)
    else:
        ext.debug.set_cpu_amx(True)  # available: the switch takes it


@pytest.mark.parametrize(("value", "on"), [
    ("0", False), (" Off ", False), ("", False), ("no", False),
    ("1", True), ("YES", True), ("on", True)])
def test_environment_switch(value, on):
    # VLLM_METAL_CPU_AMX is read once per process, as envs.py's booleans are.
    require_amx()
    env = {**os.environ, "VLLM_METAL_CPU_AMX": value}
    out = subprocess.run(
        [sys.executable, "-c", "from vllm_metal.native import get_ops; print(get_ops().cpu_amx())"],
        env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(on)
