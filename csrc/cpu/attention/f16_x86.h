// Hardware (F16C) fp16 -> fp32 decoding for the AVX2 / AVX-512 kernels.
//
// Compilers do not vectorize _Float16 conversion loops, and the portable
// bit-twiddling decoder costs ~7 instructions per vector where vcvtph2ps costs
// one; fp16 decoding is a large share of decode attention. The per-ISA kernels
// in attention_item.cpp are `flatten`ed, which inlines these into code compiled
// for the matching target.
#pragma once

#include <cstdint>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/tile_math.h"

#if VLLM_METAL_X86_DISPATCH
#include <immintrin.h>

namespace vllm_metal::cpu {

// dst[0:n] = float(src[0:n]) for IEEE half bit patterns.
VLLM_METAL_TARGET_AVX2 inline void
decode_f16_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = F16::to_float(src[i]);
}

VLLM_METAL_TARGET_AVX512 inline void
decode_f16_avx512(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = F16::to_float(src[i]);
}

} // namespace vllm_metal::cpu
#endif
