"""The runtime checks of the Metal path that Linux can run: each is a function
eval_gpu (or the Metal route of the op) calls, reached here through the
extension's debug submodule, and where the CPU path shares it, through the CPU
op as well."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import mlx.core as mx
import numpy as np
import pytest

from tests.ops.paged_inputs import make_batch
from vllm_metal.native import get_ops


@pytest.fixture(scope="module")
def debug():
    return get_ops().debug


# --- threads per threadgroup against the pipeline's maximum ---

def widest_launches(debug):
    """The planned launches with the most threads per threadgroup, per route."""
    shapes = debug.kernel_shapes()
    launches = []
    for hq, hkv, hd in shapes["gqa_decode_geometries"]:
        plan = debug.metal_launch_plan([600], [1], hq, hkv, hd, 16, "float16", "GqaDecode", partition_size=512,
                                       scale=1.0, max_blocks_per_seq=40)
        launches += plan["launches"]
    plan = debug.metal_launch_plan([600], [1], 8, 8, 256, 16, "float16", "SplitKv", partition_size=256,
                                   scale=1.0, max_blocks_per_seq=40)
    launches += plan["launches"]
    launches.append(debug.reshape_and_cache_plan("float16", 4, 8 * 256, 64)["launch"])
    return launches


def threads_of(launch):
    x, y, z = launch["threads"]
    return x * y * z


def test_the_widest_launch_is_256_threads(debug):
    assert max(threads_of(launch) for launch in widest_launches(debug)) == 256


def test_a_launch_within_the_pipeline_limit_passes(debug):
    for launch in widest_launches(debug):
        debug.check_threadgroup_size(launch["kernel"], launch["threads"], threads_of(launch))
        debug.check_threadgroup_size(launch["kernel"], launch["threads"], 1024)


def test_a_launch_beyond_the_pipeline_limit_names_kernel_and_counts(debug):
    launch = max(widest_launches(debug), key=threads_of)
    limit = threads_of(launch) - 1
    with pytest.raises(RuntimeError, match=rf"kernel {launch['kernel']} is launched with 256 threads per "
                                           rf"threadgroup, but its pipeline allows at most {limit}"):
        debug.check_threadgroup_size(launch["kernel"], launch["threads"], limit)


def test_all_three_dimensions_count(debug):
    with pytest.raises(RuntimeError, match="with 512 threads"):
        debug.check_threadgroup_size("k", (32, 4, 4), 256)


# --- the metadata check both paths share ---

METADATA_ERRORS = [
    ([1, 3, 6], [4, 5], "cu_seqlens_q\\[0\\] must be 0, got 1"),
    ([0, 3, 5], [4, 5], "cu_seqlens_q\\[-1\\] must equal query.shape\\[0\\] = 6, got 5"),
    ([0, 4, 3, 6], [4, 5, 5], "non-decreasing \\(index 1\\)"),
    ([0, 3, 6], [2, 5], "seq_lens\\[0\\] = 2 is smaller than its 3 query tokens"),
    ([0, 3, 6], [4, 65], "seq_lens\\[1\\] = 65 exceeds block_tables capacity 64"),
]


def test_consistent_metadata_passes(debug):
    debug.check_paged_metadata([0, 3, 6], [4, 64], total_q=6, capacity=64)
    debug.check_paged_metadata([0], [], total_q=0, capacity=0)


@pytest.mark.parametrize("cu,seq_lens,error", METADATA_ERRORS)
def test_inconsistent_metadata_is_refused(debug, cu, seq_lens, error):
    with pytest.raises(ValueError, match=error):
        debug.check_paged_metadata(cu, seq_lens, total_q=6, capacity=64)


def test_the_cpu_op_raises_the_same_error(debug):
    batch = make_batch([33, 20], [4, 2])  # 6 query rows
    batch.cu_seqlens_q = mx.array([0, 4, 5], dtype=mx.int32)
    with pytest.raises(ValueError) as shared:
        debug.check_paged_metadata([0, 4, 5], [33, 20], total_q=6, capacity=10**6)
    with pytest.raises(RuntimeError, match=str(shared.value).replace("[", "\\[").replace("]", "\\]")):
        mx.eval(get_ops().paged_attention(*batch.args(), stream=mx.cpu))


# --- input layouts, read when the op is evaluated ---

def lazy_transposed_cache(shape=(4, 8, 2, 64)):
    """A cache-shaped strided view, not yet evaluated."""
    blocks, block_size, heads, d = shape
    return mx.swapaxes(mx.zeros((blocks, heads, block_size, d)), 1, 2)


def test_an_unevaluated_view_shows_row_contiguous_flags(debug):
    # Why the check runs at evaluation: before it, MLX reports default flags.
    cache = lazy_transposed_cache()
    debug.require_row_contiguous("paged_attention", [cache], ["key_cache"])
    mx.eval(cache)
    with pytest.raises(ValueError, match="paged_attention: key_cache is not row-contiguous"):
        debug.require_row_contiguous("paged_attention", [cache], ["key_cache"])


def test_the_first_strided_input_is_named(debug):
    query, strided = mx.zeros((3, 2, 64)), lazy_transposed_cache()
    mx.eval(query, strided)
    with pytest.raises(ValueError, match="reshape_and_cache: value_cache is not"):
        debug.require_row_contiguous("reshape_and_cache", [query, query, query, strided],
                                     ["key", "value", "key_cache", "value_cache"])


def lazily_strided_key_cache(batch):
    """The batch's key cache values as a transpose the op sees unevaluated (flags: row-contiguous)."""
    return mx.swapaxes(mx.contiguous(mx.swapaxes(batch.key_cache, 1, 2)), 1, 2)


def test_the_cpu_op_copies_a_cache_that_is_strided_only_once_evaluated():
    batch = make_batch([70, 10], [8, 1], seed=4)
    expected = get_ops().paged_attention(*batch.args(), stream=mx.cpu)
    batch.key_cache = lazily_strided_key_cache(batch)
    np.testing.assert_array_equal(np.array(get_ops().paged_attention(*batch.args(), stream=mx.cpu)),
                                  np.array(expected))


@pytest.mark.skipif(not (mx.metal.is_available() and get_ops().metal_kernels_loaded()),
                    reason="needs the Metal kernels")
def test_the_gpu_op_refuses_a_cache_that_is_strided_only_once_evaluated():
    batch = make_batch([70, 10], [8, 1], seed=4)
    batch.key_cache = lazily_strided_key_cache(batch)
    with pytest.raises((ValueError, RuntimeError), match="key_cache is not row-contiguous"):
        mx.eval(get_ops().paged_attention(*batch.args(), stream=mx.gpu))


# --- the name MLX caches the kernel library under ---

def test_library_names_follow_what_is_loaded(debug):
    names = {debug.metal_library_name("metallib", "/a/vllm_metal_kernels.metallib"),
             debug.metal_library_name("metallib", "/b/vllm_metal_kernels.metallib"),
             debug.metal_library_name("source", "kernel void a() {}"),
             debug.metal_library_name("source", "kernel void b() {}")}
    assert len(names) == 4
    assert debug.metal_library_name("source", "x") == debug.metal_library_name("source", "x")
    assert debug.metal_library_name("source", "x") != debug.metal_library_name("metallib", "x")


def test_configuring_another_library_changes_the_cached_name():
    # In a child: configuring a library marks the kernels loaded for the process.
    script = textwrap.dedent("""
        from vllm_metal import _ext
        names = []
        for set_library, value in [(_ext._set_metal_library_path, "/x/vllm_metal_kernels.metallib"),
                                   (_ext._set_metal_library_source, "kernel void a() {}"),
                                   (_ext._set_metal_library_source, "kernel void b() {}"),
                                   (_ext._set_metal_library_path, "/x/vllm_metal_kernels.metallib")]:
            set_library(value)
            names.append(_ext.debug.configured_metal_library())
        print(" ".join(names))
        # The tensor-op library is configured apart, and leaves the main one as it was.
        print(_ext.debug.configured_metal_tensor_library())
        _ext._set_metal_tensor_library_source("kernel void a() {}")
        print(_ext.debug.configured_metal_tensor_library(), _ext.debug.configured_metal_library())
        _ext._set_metal_tensor_library_path("/x/vllm_metal_tensor_kernels.metallib")
        print(_ext.debug.configured_metal_tensor_library())
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    main_names, no_tensor, tensor_and_main, tensor_metallib = run.stdout.splitlines()
    metallib, source_a, source_b, metallib_again = main_names.split()
    assert len({metallib, source_a, source_b}) == 3
    assert metallib_again == metallib
    assert source_a == get_ops().debug.metal_library_name("source", "kernel void a() {}")
    assert no_tensor == "None"
    tensor_a, main = tensor_and_main.split()
    assert main == metallib
    # The same text in the other library is another library: MLX must not hand back the main one.
    assert tensor_a == get_ops().debug.metal_library_name("tensor_source", "kernel void a() {}")
    assert tensor_a != source_a
    assert tensor_metallib == get_ops().debug.metal_library_name(
        "tensor_metallib", "/x/vllm_metal_tensor_kernels.metallib")


def test_the_configured_name_is_one_of_ours(debug):
    if get_ops().metal_kernels_loaded():
        assert debug.configured_metal_library().startswith("vllm_metal_kernels_v2_")
    else:
        with pytest.raises(RuntimeError, match="Metal kernels were not loaded"):
            debug.configured_metal_library()
