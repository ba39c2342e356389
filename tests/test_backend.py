"""select_backend: the one place that asks which backend runs this process."""

from __future__ import annotations

import mlx.core as mx
import pytest

from vllm_metal.backend import Backend, select_backend
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.metal.backend import MetalBackend


def test_each_backend_implements_every_hook():
    for backend in (CpuBackend(), MetalBackend()):   # abstract hooks left: TypeError
        assert isinstance(backend, Backend)
        assert backend.label and isinstance(backend.sampling_kernels, bool)


def test_metal_when_mlx_has_a_metal_device_else_cpu():
    backend = select_backend()
    expected = MetalBackend if mx.metal.is_available() else CpuBackend
    assert type(backend) is expected


@pytest.mark.skipif(mx.metal.is_available(), reason="a host without Metal")
def test_init_device_makes_the_cpu_mlx_default():
    select_backend().init_device()
    assert mx.default_device().type == mx.cpu
