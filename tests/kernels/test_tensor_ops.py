"""The harness's emulation of Metal 4's tensor ops (matmul2d on one simdgroup, tensor
views, cooperative destinations; tools/msl_harness/include/msl_tensor_ops.h): a tiled
product through the documented accessors equals numpy's, the same bits under every
lane order although the layout changes with it, and each misuse the emulation
promises to show is shown on a planted bug (tests/kernels/msl/tensor_ops_probe.metal)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tools.msl_harness import MslLibrary, MslRuntimeError
from tools.msl_harness.translate import language_flags

PROBE = Path(__file__).parent / "msl" / "tensor_ops_probe.metal"
ORDERS = ("forward", "reverse", "shuffled")


@pytest.fixture(scope="module")
def probe():
    return MslLibrary(PROBE)


def _operands(k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((16, k)).astype(np.float16),
            rng.standard_normal((32, k)).astype(np.float16))


def _product(probe, a, b, *, accumulate=None, scatter=False, order="forward"):
    c = np.full((16, 32), np.nan, np.float32) if accumulate is None else accumulate.copy()
    flags = (1 if accumulate is not None else 0) | (2 if scatter else 0)
    probe.dispatch("tile_product", (1,), (32,),
                   {0: a, 1: b, 2: c, 3: np.int32(a.shape[1]), 4: np.int32(flags)}, order=order)
    return c


@pytest.mark.parametrize("k", [32, 96, 256])
def test_a_tiled_product_equals_numpys_under_every_lane_order(probe, k):
    a, b = _operands(k)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    results = [_product(probe, a, b, order=o) for o in ORDERS]
    np.testing.assert_allclose(results[0], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes()


def test_accumulate_adds_and_scatter_equals_store(probe):
    a, b = _operands(64, seed=1)
    start = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    want = start + a.astype(np.float64) @ b.astype(np.float64).T
    for order in ORDERS[:2]:
        added = _product(probe, a, b, accumulate=start, order=order)
        np.testing.assert_allclose(added, want, rtol=1e-5, atol=1e-4)
        stored = _product(probe, a, b, order=order)
        scattered = _product(probe, a, b, scatter=True, order=order)
        assert stored.tobytes() == scattered.tobytes()


def _misuse(probe, which: int, order: str = "forward", strict: bool = True):
    a, b = _operands(32, seed=3)
    c = np.full((16, 32), np.nan, np.float32)
    probe.dispatch("misuse", (1,), (32,), {0: a, 1: b, 2: c, 3: np.int32(which)},
                   order=order, strict=strict)
    return c, a.astype(np.float64) @ b.astype(np.float64).T


def test_a_kernel_that_assumes_a_layout_is_caught(probe):
    results = [_misuse(probe, 1, order)[0] for order in ORDERS]
    assert results[0].tobytes() != results[1].tobytes()   # the lane orders disagree
    right = _misuse(probe, 0)
    np.testing.assert_allclose(right[0], right[1], rtol=1e-5, atol=1e-4)


def test_accumulating_into_unset_storage_shows_nan(probe):
    c, _ = _misuse(probe, 2)
    assert np.isnan(c).all()


def test_run_by_part_of_a_simdgroup_is_reported(probe):
    with pytest.raises(MslRuntimeError, match=r"(?s)divergent_collectives.*tensor_ops_probe"):
        _misuse(probe, 3)


def test_an_operand_smaller_than_its_tile_is_reported(probe):
    with pytest.raises(MslRuntimeError, match="(?s)tensor_op_misuses=1.*left operand"):
        _misuse(probe, 4)


def test_sources_using_tensor_ops_are_read_as_metal_4(tmp_path):
    """Through a local header too; every other source stays C++17 with Metal 3.1."""
    (tmp_path / "tiles.h").write_text("#include <MetalPerformancePrimitives/"
                                      "MetalPerformancePrimitives.h>\n")
    (tmp_path / "uses.metal").write_text('#include "tiles.h"\n')
    (tmp_path / "plain.metal").write_text('#include <metal_stdlib>\n')
    assert "-std=c++20" in language_flags(tmp_path / "uses.metal")
    assert "-D__HAVE_TENSOR__=1" in language_flags(tmp_path / "uses.metal")
    assert language_flags(tmp_path / "plain.metal") == ("-std=c++17", "-D__METAL_VERSION__=310")
    assert "-std=c++20" in language_flags(PROBE)
