"""torch <-> MLX bridge: shared memory is really shared, values round-trip bit-exactly."""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest
import torch

from vllm_metal.pytorch_backend import shared_regions
from vllm_metal.pytorch_backend.tensor_bridge import (
    MLX_TO_TORCH_DTYPE,
    TORCH_TO_MLX_DTYPE,
    _export_via_buffer,
    mlx_dtype_from_torch,
    mlx_to_torch,
    torch_dtype_from_mlx,
    torch_to_mlx,
)

ALL_TORCH_DTYPES = list(TORCH_TO_MLX_DTYPE)


def _bits(x) -> np.ndarray:
    """Raw element bits as an unsigned numpy array (bfloat16 included), for exact compares."""
    if isinstance(x, mx.array):
        unsigned = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}[x.itemsize]
        return np.array(mx.view(x, unsigned))
    unsigned = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
    return x.contiguous().view(unsigned[x.element_size()]).numpy().copy()


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    """Values that stress exactness: extremes, signed zero, inf/nan for floats."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g) * 1e3).to(dtype)
        flat = t.view(-1)
        info = torch.finfo(dtype)
        flat[:5] = torch.tensor([info.max, info.tiny, -0.0, float("inf"), float("nan")]).to(dtype)
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(-100 if info.min < 0 else 0, 100, shape, generator=g).to(dtype)
    t.view(-1)[:2] = torch.tensor([info.min, info.max], dtype=dtype)
    return t


def _address(a: mx.array) -> int:
    return np.asarray(a).__array_interface__["data"][0]


def test_mlx_to_torch_shares_memory_and_torch_writes_reach_mlx():
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    t = mlx_to_torch(a)
    assert t.data_ptr() == _address(a)
    t[1, 2] = -7.0
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected[1, 2] = -7.0
    np.testing.assert_array_equal(np.array(a), expected)
    # MLX ops evaluated after the write see it too.
    assert (a * 2).sum().item() == expected.sum() * 2


def test_torch_view_of_mlx_memory_comes_back_shared():
    a = mx.arange(24, dtype=mx.int32).reshape(4, 6)
    t = mlx_to_torch(a)
    view = t[1:3, ::2]  # offset and a column stride of 2
    m = torch_to_mlx(view)
    assert m.shape == (2, 3)
    np.testing.assert_array_equal(np.array(m), np.arange(24).reshape(4, 6)[1:3, ::2])
    t[2, 4] = 1000  # write through torch, read through the MLX view
    assert m[1, 2].item() == 1000
    assert _address(m) == view.data_ptr()


def test_torch_dtype_reinterpretation_comes_back_as_mlx_view():
    a = mx.array([1.0, -2.0, 0.5], dtype=mx.float32)
    as_int = mlx_to_torch(a).view(torch.int32)
    m = torch_to_mlx(as_int)
    assert m.dtype == mx.int32
    expected = np.array([1.0, -2.0, 0.5], np.float32).view(np.int32)
    np.testing.assert_array_equal(np.array(m), expected)


def test_mlx_functional_update_never_writes_into_exported_memory():
    a = mx.zeros((4,), dtype=mx.float32)
    t = mlx_to_torch(a)
    a[1] = 5.0  # MLX arrays are values: this builds a new array
    mx.eval(a)
    assert a[1].item() == 5.0
    assert t.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_torch_allocated_memory_is_refused_without_copy():
    t = torch.arange(6, dtype=torch.float32)
    with pytest.raises(ValueError, match="copy=True"):
        torch_to_mlx(t)
    m = torch_to_mlx(t, copy=True)
    t[0] = 42.0  # a copy does not follow later writes
    np.testing.assert_array_equal(np.array(m), np.arange(6, dtype=np.float32))


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_every_dtype_round_trips_exactly(dtype):
    src = _sample(dtype)
    m = torch_to_mlx(src, copy=True)
    assert m.dtype == TORCH_TO_MLX_DTYPE[dtype]
    np.testing.assert_array_equal(_bits(m), _bits(src))

    back = mlx_to_torch(m)  # shared
    assert back.dtype == dtype
    np.testing.assert_array_equal(_bits(back), _bits(src))

    again = torch_to_mlx(back)  # shared again: MLX owns this memory
    np.testing.assert_array_equal(_bits(again), _bits(src))

    private = mlx_to_torch(m, copy=True)
    assert private.data_ptr() != back.data_ptr()
    np.testing.assert_array_equal(_bits(private), _bits(src))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.bool], ids=str)
def test_buffer_protocol_export_shares_memory(dtype):
    # The path taken when torch cannot import MLX's DLPack device (Metal).
    src = _sample(dtype, (4, 6))
    m = torch_to_mlx(src, copy=True).T  # strided view
    mx.eval(m)
    t = _export_via_buffer(m)
    assert t.dtype == dtype and t.shape == (6, 4) and t.stride() == (1, 6)
    np.testing.assert_array_equal(_bits(t), _bits(src.T))
    t[0, 1] = t[0, 0] if dtype == torch.bool else 3
    assert m[0, 1].item() == t[0, 1].item()


def test_non_contiguous_mlx_arrays_export_with_their_strides():
    base = mx.arange(20, dtype=mx.float32).reshape(4, 5)
    ref = np.arange(20, dtype=np.float32).reshape(4, 5)
    for arr, expected, strides in [
        (base.T, ref.T, (1, 5)),
        (base[:, 1::2], ref[:, 1::2], (5, 2)),
        (mx.broadcast_to(mx.array([1.0, 2.0]), (3, 2)), np.tile([1.0, 2.0], (3, 1)), (0, 1)),
    ]:
        t = mlx_to_torch(arr)
        assert t.stride() == strides
        np.testing.assert_array_equal(t.numpy(), expected)
    t = mlx_to_torch(base.T)
    t[3, 1] = -1.0  # the transpose aliases base
    assert base[1, 3].item() == -1.0


def test_non_contiguous_export_does_not_come_back_without_copy():
    # Only row-contiguous exports are recorded: a transposed root cannot be re-viewed flat.
    t = mlx_to_torch(mx.arange(6, dtype=mx.float32).reshape(2, 3).T)
    with pytest.raises(ValueError, match="copy=True"):
        torch_to_mlx(t)
    np.testing.assert_array_equal(np.array(torch_to_mlx(t, copy=True)), t.numpy())


def test_non_contiguous_torch_tensor_copies_exactly():
    t = torch.arange(24, dtype=torch.float16).reshape(4, 6)[1:, ::3].t()
    m = torch_to_mlx(t, copy=True)
    np.testing.assert_array_equal(np.array(m), t.numpy())


def test_negative_mlx_strides_are_rejected_or_copied_on_request():
    a = mx.arange(6, dtype=mx.float32)[::-1]
    with pytest.raises(ValueError, match="negative strides"):
        mlx_to_torch(a)
    t = mlx_to_torch(a, copy=True)
    assert t.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_torch_cannot_even_build_negative_strides():
    # The torch side guard is defensive: torch refuses negative strides itself.
    with pytest.raises(RuntimeError):
        torch.arange(4.0).as_strided((4,), (-1,), 3)


def test_zero_dim_both_ways():
    a = mx.array(2.5, dtype=mx.bfloat16)
    t = mlx_to_torch(a)
    assert t.shape == () and t.item() == 2.5
    t.fill_(-1.5)
    assert a.item() == -1.5
    m = torch_to_mlx(t)
    assert m.shape == () and m.item() == -1.5
    assert torch_to_mlx(torch.tensor(7, dtype=torch.int64), copy=True).item() == 7


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2)])
def test_empty_both_ways(shape):
    a = mx.zeros(shape, dtype=mx.int16)
    t = mlx_to_torch(a)
    assert t.shape == shape and t.dtype == torch.int16
    for copy in (False, True):
        m = torch_to_mlx(torch.empty(shape, dtype=torch.uint8), copy=copy)
        assert m.shape == shape and m.dtype == mx.uint8


def test_exported_tensor_outlives_the_mlx_array_and_registry_drains():
    before = shared_regions.live_region_count()
    a = mx.arange(4096, dtype=mx.float32)
    t = mlx_to_torch(a)
    view = t[10:20]
    assert shared_regions.live_region_count() == before + 1
    del a, t
    gc.collect()
    mx.eval([mx.full((4096,), float(i)) for i in range(8)])  # reuse freed MLX memory
    assert view.tolist() == [float(i) for i in range(10, 20)]
    assert torch_to_mlx(view).tolist() == view.tolist()
    del view
    gc.collect()
    assert shared_regions.live_region_count() == before


def test_requires_grad_tensor_is_accepted():
    t = torch.ones(3, requires_grad=True)
    assert torch_to_mlx(t, copy=True).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: torch_to_mlx(np.zeros(3)), TypeError, "torch.Tensor"),
        (lambda: mlx_to_torch(torch.zeros(3)), TypeError, "mlx.core.array"),
        (lambda: torch_to_mlx(torch.zeros(3, dtype=torch.float64)), TypeError, "float64"),
        (lambda: torch_to_mlx(torch.zeros(2, dtype=torch.complex64)), TypeError, "complex64"),
        (lambda: mlx_to_torch(mx.zeros(2, dtype=mx.complex64)), TypeError, "complex64"),
        (lambda: torch_to_mlx(torch.zeros(3, device="meta"), copy=True), ValueError, "meta"),
        (lambda: torch_to_mlx(torch.zeros(3, 3).to_sparse(), copy=True), ValueError, "layout"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_dtype_maps_are_inverse_and_helpers_agree():
    assert len(TORCH_TO_MLX_DTYPE) == len(MLX_TO_TORCH_DTYPE)
    for t, m in TORCH_TO_MLX_DTYPE.items():
        assert MLX_TO_TORCH_DTYPE[m] == t
        assert mlx_dtype_from_torch(t) == m and torch_dtype_from_mlx(m) == t
        assert torch.empty((), dtype=t).element_size() == m.size
    with pytest.raises(TypeError, match="torch.dtype"):
        mlx_dtype_from_torch("float32")
    with pytest.raises(TypeError, match="mlx.core.Dtype"):
        torch_dtype_from_mlx(torch.float32)
    with pytest.raises(TypeError, match="float64"):
        torch_dtype_from_mlx(mx.float64)
