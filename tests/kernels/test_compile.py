"""Every kernels_v2 .metal file and every instantiation compiles on the harness,
the host builds exactly the instantiated kernel names, and the kernel constants
reach every build from vllm_metal/native/constants.py alone."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from tools.msl_harness import KERNELS_DIR, MslCompileError, MslLibrary, kernel_defines
from vllm_metal.native import constants

REPO = Path(__file__).resolve().parents[2]
DTYPES = ["float16", "bfloat16", "float32"]


def host_names(ext) -> set[str]:
    """Every kernel name eval_gpu can ask for, built by the host's own name builders."""
    shapes = ext.debug.kernel_shapes()
    names = set()
    for dtype, hd, bs in itertools.product(DTYPES, shapes["head_sizes"], shapes["block_sizes"]):
        plan = ext.debug.metal_launch_plan([600], [1], 2, 1, hd, bs, dtype, "SplitKv", partition_size=256,
                                      scale=1.0, max_blocks_per_seq=600 // bs + 1)
        names.update(launch["kernel"] for launch in plan["launches"])
    for dtype, hd, bs in itertools.product(DTYPES[:2], (64, 128, 256), shapes["block_sizes"]):
        plan = ext.debug.metal_launch_plan([64], [64], 2, 1, hd, bs, dtype, "NaxPrefill", scale=1.0,
                                           max_blocks_per_seq=64 // bs)
        names.update(launch["kernel"] for launch in plan["launches"])
    for dtype, (hq, hkv, hd), bs in itertools.product(DTYPES, shapes["gqa_decode_geometries"],
                                                     shapes["block_sizes"]):
        plan = ext.debug.metal_launch_plan([10], [1], hq, hkv, hd, bs, dtype, "GqaDecode", partition_size=512,
                                      scale=1.0, max_blocks_per_seq=2)
        names.update(launch["kernel"] for launch in plan["launches"])
    for dtype in DTYPES:
        names.add(ext.debug.reshape_and_cache_plan(dtype, 1, 64, 64)["launch"]["kernel"])
        names.add(ext.debug.reshape_and_cache_plan(dtype, 1, 64, 64, kv_quant=2,
                                                   head_size=64)["launch"]["kernel"])
        for add in (False, True):
            plan = ext.debug.lora_launch_plan(dtype, 1, 8, 8, 4, 1, add=add, out_cols=8)
            names.update(launch["kernel"] for launch in plan["launches"])
        for bits, mxfp4 in ((0, False), (4, False), (8, False), (4, True)):
            names.add(ext.debug.experts_launch_plan(dtype, bits, 1, 2, 64, 8, 4, group_size=32,
                                                    mxfp4=mxfp4)["kernel"])
        for op in ("latent_cache_write", "mla_attention"):
            names.add(ext.debug.mla_launch_plan(op, dtype, 1, num_seqs=1, num_heads=1, rank=64, rope_dim=16,
                                                block_size=16, num_blocks=1, max_blocks_per_seq=1)["kernel"])
        conv = ext.debug.gdn_launch_plan("short_conv", dtype, 1, num_seqs=1, num_blocks=1,
                                         lo_width=96, channels=32, taps=4)
        delta = ext.debug.gdn_launch_plan("gated_delta", dtype, 1, num_seqs=1, num_blocks=1,
                                          lo_width=512, hi_width=512, num_k_heads=1,
                                          num_v_heads=1, head_k_dim=32, head_v_dim=16)
        chunked = ext.debug.gdn_launch_plan("gated_delta", dtype, 1, num_seqs=1, num_blocks=1,
                                            lo_width=512, hi_width=512, num_k_heads=1,
                                            num_v_heads=1, head_k_dim=32, head_v_dim=16, chunk=64)
        names.update(launch["kernel"]
                     for launch in conv["launches"] + delta["launches"] + chunked["launches"])
    return names


def test_every_metal_file_compiles(kernels):
    assert sorted(kernels) == sorted(p.stem for p in KERNELS_DIR.glob("*.metal"))
    assert all(lib.kernels for lib in kernels.values())


# 63 varlen + 36 GQA decode (12 specializations x 3 dtypes) + 21 reduce + 3 cache writes
# + 3 quantized cache writes (the attention kernels read quantized caches through a
# function constant) + 9 LoRA (shrink, expand, expand_add x 3 dtypes) + 12 experts
# (float, q4, q8, mxfp4 x 3 dtypes) + 6 MLA (cache write, attention x 3 dtypes)
# + 12 GDN (conv rows, conv state, gated delta, chunked gated delta x 3 dtypes) + 18 NAX
# prefill (float16, bfloat16 x head sizes 64, 128, 256 x 3 block sizes)
NAX_KERNELS = 18
INSTANTIATED = 63 + 36 + 21 + 3 + 3 + 9 + 12 + 6 + 12 + NAX_KERNELS


def test_host_names_are_exactly_the_instantiations(kernels, ext):
    instantiated = set().union(*(lib.kernels for lib in kernels.values()))
    assert host_names(ext) == instantiated
    assert len(instantiated) == INSTANTIATED


def test_block_size_instantiations_follow_constants_py(kernels):
    gqa = kernels["paged_attention_gqa_decode"].kernels
    sizes = {int(re.search(r"_bs(\d+)$", name).group(1)) for name in gqa}
    assert sizes == set(constants.KERNEL_BLOCK_SIZES)


def test_harness_defines_come_from_constants_py():
    defines = kernel_defines()
    assert defines["VLLM_METAL_PARTITION_SIZE"] == str(constants.PARTITION_SIZE)
    assert defines["VLLM_METAL_KERNEL_BLOCK_SIZES"] == ",".join(map(str, constants.KERNEL_BLOCK_SIZES))


def test_extension_was_built_with_constants_py(ext):
    assert ext.PARTITION_SIZE == constants.PARTITION_SIZE
    assert tuple(ext.KERNEL_BLOCK_SIZES) == tuple(constants.KERNEL_BLOCK_SIZES)
    assert ext.debug.kernel_shapes()["block_sizes"] == list(constants.KERNEL_BLOCK_SIZES)


def test_kernels_refuse_to_build_without_the_constants(tmp_path):
    with pytest.raises(MslCompileError, match="must come from vllm_metal/native/constants.py"):
        MslLibrary(KERNELS_DIR / "paged_attention_gqa_decode.metal", defines={}, cache_dir=tmp_path)


def test_partition_size_not_dividing_a_block_size_is_a_compile_error(tmp_path):
    # The GQA kernel asserts partitions hold whole pages: a drifted constant cannot slip through.
    defines = dict(kernel_defines(), VLLM_METAL_PARTITION_SIZE="520")
    with pytest.raises(MslCompileError, match="partitions must hold whole pages"):
        MslLibrary(KERNELS_DIR / "paged_attention_gqa_decode.metal", defines=defines, cache_dir=tmp_path)


def test_no_source_defines_its_own_copy_of_the_constants():
    pattern = re.compile(r"#\s*define\s+VLLM_METAL_(PARTITION_SIZE|KERNEL_BLOCK_SIZES)\b|"
                         r"\b(kPartitionSize|kKernelBlockSizes)\s*=\s*\d|"
                         r"^\s*(PARTITION_SIZE|KERNEL_BLOCK_SIZES)\s*=", re.MULTILINE)
    sources = [*KERNELS_DIR.glob("*"), *(REPO / "csrc").rglob("*.[ch]*")]
    sources += [p for d in ("vllm_metal", "tools", "benchmarks") for p in (REPO / d).rglob("*.py")]
    own = REPO / "vllm_metal" / "native" / "constants.py"
    offenders = [str(p.relative_to(REPO)) for p in sources
                 if p.is_file() and p != own and pattern.search(p.read_text())]
    assert offenders == []
    assert pattern.search(own.read_text())  # the pattern does find a definition


def test_params_block_is_packed_four_byte_scalars(ext):
    # Metal and C++ lay out a struct of 4-byte scalars identically: consecutive, no padding,
    # so the bytes the host sets at buffer(10) read the same in the shader.
    fields, size = ext.debug.paged_params_layout()
    assert [offset for _, offset in fields] == [4 * i for i in range(len(fields))]
    assert size == 4 * len(fields)
    header = (KERNELS_DIR / "paged_attention_params.h").read_text()
    body = header[header.index("struct PagedAttentionParams"):header.index("};")]
    declared = re.findall(r"^\s*(?:int|float)\s+(\w+);", body, re.MULTILINE)
    assert [name for name, _ in fields] == declared  # the layout binding lists every member


def test_cmake_passes_the_same_macros_to_the_metal_compiler():
    cmake = (REPO / "csrc" / "cmake" / "kernels_v2.cmake").read_text()
    assert "-DVLLM_METAL_PARTITION_SIZE=${VLLM_METAL_PARTITION_SIZE}" in cmake
    assert "-DVLLM_METAL_KERNEL_BLOCK_SIZES=${VLLM_METAL_KERNEL_BLOCK_SIZES}" in cmake
    # MLX's JIT (VLLM_METAL_BUILD_FROM_SOURCE=1) compiles without fast math: so does the metallib.
    assert "-fno-fast-math" in cmake
