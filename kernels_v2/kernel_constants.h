// Compile-time facts shared by the Metal kernels and the host (C++ and the
// CPU harness): kernel constants from vllm_metal/native/constants.py, the
// instantiated shapes, and the function-constant indices.
#pragma once

// Passed by every build (CMake for the extension and the metallib, the
// harness for Linux tests), always from vllm_metal/native/constants.py.
#if !defined(VLLM_METAL_PARTITION_SIZE) || !defined(VLLM_METAL_KERNEL_BLOCK_SIZES)
#error "VLLM_METAL_PARTITION_SIZE and VLLM_METAL_KERNEL_BLOCK_SIZES must come from vllm_metal/native/constants.py"
#endif

// Split-KV falls back to half-size partitions when 512-token ones are too few.
#define VLLM_METAL_SMALL_PARTITION_SIZE (VLLM_METAL_PARTITION_SIZE / 2)

// Function-constant indices (macros: MSL attributes need literals).
#define VLLM_METAL_FC_SLIDING_WINDOW 0
#define VLLM_METAL_FC_SOFTCAP 1
#define VLLM_METAL_FC_SINKS 2
#define VLLM_METAL_FC_WRITE_PARTIALS 3
#define VLLM_METAL_FC_KV_QUANT 4  // int: a KvQuant (csrc/kv_quant.h), 0 = float cache

// VLLM_METAL_EACH(F, args, a, b, c) -> F(args, a) F(args, b) F(args, c), up to 8
// items. A second family (EACH_INNER) nests inside the first: a macro cannot
// expand inside its own expansion.
#define VLLM_METAL_UNPACK(...) __VA_ARGS__
#define VLLM_METAL_APPLY(F, ...) F(__VA_ARGS__)  // arguments expand (tuples unpack) first
#define VLLM_METAL_STRINGIFY_(x) #x
#define VLLM_METAL_STRINGIFY(x) VLLM_METAL_STRINGIFY_(x)  // host names are one literal, built by token pasting
#define VLLM_METAL_CAT_(a, b) a##b
#define VLLM_METAL_CAT(a, b) VLLM_METAL_CAT_(a, b)
#define VLLM_METAL_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define VLLM_METAL_COUNT(...) VLLM_METAL_COUNT_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define VLLM_METAL_EACH_1(F, A, x) F(A, x)
#define VLLM_METAL_EACH_2(F, A, x, ...) F(A, x) VLLM_METAL_EACH_1(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_3(F, A, x, ...) F(A, x) VLLM_METAL_EACH_2(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_4(F, A, x, ...) F(A, x) VLLM_METAL_EACH_3(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_5(F, A, x, ...) F(A, x) VLLM_METAL_EACH_4(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_6(F, A, x, ...) F(A, x) VLLM_METAL_EACH_5(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_7(F, A, x, ...) F(A, x) VLLM_METAL_EACH_6(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_8(F, A, x, ...) F(A, x) VLLM_METAL_EACH_7(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH(F, A, ...) VLLM_METAL_CAT(VLLM_METAL_EACH_, VLLM_METAL_COUNT(__VA_ARGS__))(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_1(F, A, x) F(A, x)
#define VLLM_METAL_EACH_INNER_2(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_1(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_3(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_2(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_4(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_3(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_5(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_4(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_6(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_5(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_7(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_6(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER_8(F, A, x, ...) F(A, x) VLLM_METAL_EACH_INNER_7(F, A, __VA_ARGS__)
#define VLLM_METAL_EACH_INNER(F, A, ...) \
  VLLM_METAL_CAT(VLLM_METAL_EACH_INNER_, VLLM_METAL_COUNT(__VA_ARGS__))(F, A, __VA_ARGS__)

// F(args, block_size) for every KERNEL_BLOCK_SIZES entry.
// The innermost loop everywhere, so it uses the inner family.
#define VLLM_METAL_FOR_EACH_BLOCK_SIZE(F, A) VLLM_METAL_EACH_INNER(F, A, VLLM_METAL_KERNEL_BLOCK_SIZES)

// Head sizes of the varlen kernel and the split-KV reduce.
#define VLLM_METAL_FOR_EACH_HEAD_SIZE(F, A) VLLM_METAL_EACH(F, A, 64, 80, 96, 112, 128, 192, 256)

// GQA decode geometries as (query heads, KV heads, head size): Llama-3-8B class,
// and three wider-group shapes. F(args, geometry) with geometry a (hq, hkv, d) tuple.
#define VLLM_METAL_FOR_EACH_GQA_GEOMETRY(F, A) \
  VLLM_METAL_EACH(F, A, (32, 8, 128), (24, 4, 256), (16, 2, 128), (16, 2, 256))

// F(args, name, type) for the three supported element types.
#define VLLM_METAL_FOR_EACH_DTYPE(F, A) F(A, float16, half) F(A, bfloat16, bfloat) F(A, float32, float)
// The tensor-op prefill (paged_attention_nax_prefill): its head sizes and dtypes.
#define VLLM_METAL_FOR_EACH_NAX_HEAD_SIZE(F, A) VLLM_METAL_EACH(F, A, 64, 128, 256)
#define VLLM_METAL_FOR_EACH_NAX_DTYPE(F, A) F(A, float16, half) F(A, bfloat16, bfloat)
