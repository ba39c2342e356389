// The chunked gated delta rule compiled for AVX-512 (F, VL, BW, DQ) + FMA + F16C.
#include "cpu/gdn/gdn_chunked.h"

#if VLLM_METAL_X86_DISPATCH
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/tile_math.h"

// Everything defined between push and pop is built for this ISA only; the
// namespace keeps those symbols apart from the other ISAs' copies.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
#endif

namespace vllm_metal::cpu::gdn_avx512 {
namespace {
#include "cpu/linear/simd_avx512.inc"
#include "cpu/gdn/gdn_chunked.inc"

const GdnChunkKernels kTable = {chunked_rows};
}  // namespace
}  // namespace vllm_metal::cpu::gdn_avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace vllm_metal::cpu {
const GdnChunkKernels& gdn_chunk_kernels_avx512() {
  return gdn_avx512::kTable;
}
}  // namespace vllm_metal::cpu
#endif
