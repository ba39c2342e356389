"""vllm_metal.native.get_ops: the checked, cached loader of the extension."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import mlx.core as mx
import pytest

from vllm_metal.native import check_constants, check_mlx_version, constants, get_ops


def test_compiled_constants_match_constants_py():
    ext = get_ops()
    assert ext.PARTITION_SIZE == constants.PARTITION_SIZE
    assert tuple(ext.KERNEL_BLOCK_SIZES) == tuple(constants.KERNEL_BLOCK_SIZES)


def test_built_against_the_running_mlx():
    assert get_ops().mlx_build_version == mx.__version__


def test_get_ops_is_cached():
    assert get_ops() is get_ops()


def test_logs_once_when_loaded(caplog):
    get_ops.cache_clear()
    with caplog.at_level(logging.INFO, logger="vllm_metal"):
        get_ops()
        get_ops()
    loaded = [r for r in caplog.records if "Native paged-attention CPU kernels loaded" in r.message]
    assert len(loaded) == 1


def test_logs_the_metal_line_when_metal_is_available(caplog, monkeypatch):
    # What a Mac logs; the library configuration itself is tested in test_kernel_loading.py.
    import vllm_metal.native as loader

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(loader, "_configure_metal", lambda ext, from_source: "prebuilt test.metallib")
    get_ops.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="vllm_metal"):
            ext = get_ops()
    finally:
        get_ops.cache_clear()
    lines = [r.message for r in caplog.records if "kernels loaded" in r.message]
    assert lines == [f"Native paged-attention Metal kernels loaded (prebuilt test.metallib, "
                     f"{ext.gpu_core_count()} GPU cores)"]


def test_mlx_version_mismatch_is_refused_with_rebuild_hint():
    with pytest.raises(ImportError, match="built against MLX 0.1.0 .* rebuild"):
        check_mlx_version("0.1.0", mx.__version__)
    check_mlx_version(mx.__version__, mx.__version__)


def test_stale_compiled_constants_are_refused():
    stale = types.SimpleNamespace(PARTITION_SIZE=256,
                                  KERNEL_BLOCK_SIZES=constants.KERNEL_BLOCK_SIZES)
    with pytest.raises(ImportError, match="PARTITION_SIZE.*rebuild"):
        check_constants(stale)


def test_cpu_isa_is_reported_and_only_narrowed():
    ext = get_ops()
    assert ext.cpu_isa() in ("avx512", "avx2", "generic")
    with pytest.raises(ValueError, match="expected 'avx512', 'avx2' or 'generic'"):
        ext.debug.set_cpu_isa("sse9")
    if ext.cpu_isa() != "avx512":
        with pytest.raises(ValueError, match="does not support avx512"):
            ext.debug.set_cpu_isa("avx512")


def run_with_threads(value: str) -> subprocess.CompletedProcess:
    code = (
        "import mlx.core as mx\n"
        "from vllm_metal.native import get_ops\n"
        "from vllm_metal.ops import paged_attention\n"
        "from tests.ops.paged_inputs import make_batch\n"
        "b = make_batch([700, 30], [1, 30], num_heads=4, num_kv_heads=1)\n"
        "mx.eval(paged_attention(*b.args()))\n"
        "print(get_ops().cpu_threads())\n"
    )
    # -P plus our sys.path: the child imports vllm_metal exactly as this process did.
    env = dict(os.environ, VLLM_METAL_CPU_THREADS=value,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)


def test_cpu_threads_follows_environment_variable():
    result = run_with_threads("3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3"


def test_invalid_cpu_threads_environment_variable_is_a_clear_error():
    result = run_with_threads("many")
    assert result.returncode != 0
    assert "VLLM_METAL_CPU_THREADS must be an integer >= 0" in result.stderr
