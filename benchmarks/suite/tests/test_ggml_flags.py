"""llama.cpp's CPU options: each x86 extension the CPU reports, never AMX or -march=native."""

from benchmarks.suite.ggml_flags import ggml_cpu_options

CPUINFO = ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_vnni "
           "avx512_bf16 amx_tile amx_int8\n\nprocessor\t: 1\nflags\t\t: fpu\n")


def test_x86_names_each_reported_extension_and_turns_amx_off():
    options = ggml_cpu_options("x86_64", CPUINFO)
    assert "-DGGML_NATIVE=OFF" in options
    for on in ("AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{on}=ON" in options
    for off in ("AVX512_VBMI", "AVX_VNNI", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{off}=OFF" in options


def test_an_avx2_host_gets_no_avx512():
    options = ggml_cpu_options("x86_64", "flags\t: avx avx2 fma f16c\n")
    assert "-DGGML_AVX2=ON" in options and "-DGGML_AVX512=OFF" in options


def test_other_machines_build_natively():
    assert ggml_cpu_options("arm64", "") == ["-DGGML_NATIVE=ON"]
