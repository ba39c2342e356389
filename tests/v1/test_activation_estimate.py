"""The memory budget's activation term: the CPU kernels' own scratch is counted, and the
profiling estimate covers what a full-size step really takes (MLX's arrays plus that
scratch)."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from tests.tiny_models import cached_tiny_model
from vllm_metal.attention.caches.paged_kv_cache import PagedKVCache
from vllm_metal.cpu.backend import CpuBackend
from vllm_metal.native import get_ops
from vllm_metal.v1.model_lifecycle import load_model
from vllm_metal.v1.model_runner import MetalModelRunner, _synthetic_prefill

BLOCK = 16


@pytest.fixture(scope="module")
def loaded():
    model = load_model(str(cached_tiny_model("llama", quantize_bits=4, group_size=32)), mx.float32,
                       CpuBackend())
    assert model.backbone.stack is not None, "the estimate is about the CPU fast path"
    return model


def _runner(loaded, max_num_batched_tokens: int) -> MetalModelRunner:
    """A runner with just what profile_run and _forward read (no vLLM config)."""
    runner = object.__new__(MetalModelRunner)
    runner.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"))
    runner.backend = CpuBackend()
    runner.loaded = loaded
    runner.block_size = BLOCK
    runner.max_model_len = 4096
    runner.max_num_reqs = 8
    runner.max_num_batched_tokens = max_num_batched_tokens
    runner._debug_sync = False
    runner._states = {}  # no recurrent-state layers
    return runner


def _step_peak(runner: MetalModelRunner, tokens: int) -> tuple[int, int, int]:
    """Bytes of one prefill forward: MLX's peak above its live level, the kernels'
    scratch peak above its live level, and that peak whole (kept buffers included)."""
    d = runner.loaded.dims
    blocks = -(-tokens // BLOCK)
    cache = PagedKVCache(d.num_layers, blocks + 1, BLOCK, d.num_kv_heads, d.head_dim, mx.float32)
    step = _synthetic_prefill(np.array([tokens], dtype=np.int32), blocks, BLOCK)
    scratch_before, _ = get_ops().scratch_bytes()
    arrays, peak = runner.forward_peak(step, cache)
    return arrays, peak - scratch_before, peak


def test_decoder_stack_scratch_is_counted_and_given_back(loaded):
    runner = _runner(loaded, 512)
    d = loaded.dims
    cfg = loaded.model.args
    tokens = 200
    _, scratch, peak = _step_peak(runner, tokens)
    # The stack's own activations: residual, normed input and output (hidden each), q and
    # attention output, k and v, gate and up, in float32.
    widths = (3 * cfg.hidden_size + 2 * d.num_heads * d.head_dim
              + 2 * d.num_kv_heads * d.head_dim + 2 * cfg.intermediate_size)
    assert scratch >= tokens * widths * 4
    # Released after each step: only the threads' kept buffers stay (one per thread that
    # ran a job, each at most one step's scratch), however many steps run.
    for _ in range(12):
        _step_peak(runner, tokens)
    assert get_ops().scratch_bytes()[0] <= (get_ops().cpu_threads() + 2) * peak


def test_profile_estimate_covers_a_full_size_step(loaded):
    target = 1024
    runner = _runner(loaded, target)
    estimate = runner.profile_run()
    mlx_peak, _, scratch_peak = _step_peak(runner, target)
    assert scratch_peak > 0
    assert estimate.arrays >= mlx_peak, (estimate, mlx_peak)
    assert estimate.kernel_scratch >= scratch_peak, (estimate, scratch_peak)
    assert estimate.total == estimate.arrays + estimate.kernel_scratch
