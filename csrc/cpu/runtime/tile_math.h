// Vectorizable fp32 building blocks of the CPU attention kernel.
//
// Everything here is always_inline and target-neutral: each ISA wrapper in
// attention_item.cpp inlines these bodies and the compiler vectorizes them for
// that ISA. Loops are written over contiguous rows so `omp simd` applies.
// D is the head size as a compile-time constant (0 = use the runtime `d`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#define VLLM_METAL_INLINE inline __attribute__((always_inline))

namespace vllm_metal::cpu {

template <typename To, typename From>
VLLM_METAL_INLINE To bit_cast(From v) {
  static_assert(sizeof(To) == sizeof(From));
  return __builtin_bit_cast(To, v);
}

// Storage formats of K/V cache elements, decoded to fp32 on load.
struct F32 {
  using storage = float;
  static constexpr bool kScaled = false;
  static VLLM_METAL_INLINE float to_float(float x) {
    return x;
  }
  static VLLM_METAL_INLINE float from_float(float x) {
    return x;
  }
};

struct BF16 {
  using storage = uint16_t;
  static constexpr bool kScaled = false;
  static VLLM_METAL_INLINE float to_float(uint16_t h) {
    return bit_cast<float>(static_cast<uint32_t>(h) << 16);
  }
  // Round to nearest even; NaN stays NaN (quiet bit forced).
  static VLLM_METAL_INLINE uint16_t from_float(float f) {
    uint32_t u = bit_cast<uint32_t>(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
  }
};

struct F16 {
  using storage = uint16_t;
  static constexpr bool kScaled = false;
  // Branch-free IEEE half -> float: shift the exponent/mantissa into place,
  // then one multiply by 2^112 rebiases normals and denormals alike.
  static VLLM_METAL_INLINE float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
    float mag = bit_cast<float>(em) * 0x1p112f;
    uint32_t bits = bit_cast<uint32_t>(mag);
    bits = (mag >= 65536.0f) ? (bits | 0x7f800000u) : bits; // inf / nan
    return bit_cast<float>(bits | sign);
  }
  // Round to nearest even, branch-free so loops vectorize.
  static VLLM_METAL_INLINE uint16_t from_float(float f) {
    uint32_t u = bit_cast<uint32_t>(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    // Normal halves: rebias the exponent, round the 13 dropped mantissa bits.
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    // Subnormal halves (|f| < 2^-14): adding 0.5 lines the value up with the
    // 2^-24 steps of a subnormal half, and the FPU rounds it to nearest even.
    uint32_t sub = bit_cast<uint32_t>(bit_cast<float>(a) + 0.5f) - 0x3f000000u;
    uint32_t h = a < 0x38800000u ? sub : normal;
    h = a >= 0x477ff000u ? 0x7c00u : h; // rounds past the largest half: inf
    h = a > 0x7f800000u ? 0x7e00u : h; // nan
    return static_cast<uint16_t>(h | sign);
  }
};

// Codes of a quantized KV cache (kv_quant.h): kScaled types keep one fp32
// scale after each head row. to_float gives the code's value divided by
// kRawScale (e4m3 widens exactly into an fp16 that is 2^8 too small, so the
// vector kernels decode it with one conversion); kernels multiply by the
// row's scale * kRawScale.
struct I8 {
  using storage = int8_t;
  static constexpr bool kScaled = true;
  static constexpr float kRawScale = 1.0f;
  static VLLM_METAL_INLINE float to_float(int8_t c) {
    return static_cast<float>(c);
  }
};

struct E4M3 {
  using storage = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr float kRawScale = 256.0f;
  // s eeee mmm -> fp16 s 0eeee mmm0000000: exponent bias 15 instead of 7.
  static VLLM_METAL_INLINE float to_float(uint8_t c) {
    return F16::to_float(static_cast<uint16_t>(((c & 0x80u) << 8) | ((c & 0x7fu) << 7)));
  }
};

// Rows of a rotated 4-bit cache (kv_quant.h, KvQuant::Rot4): packed codes that
// only the pieces kernel reads, widening whole head rows (decode_row.inc).
struct R4 {
  using storage = uint8_t;
  static constexpr bool kScaled = false;
};

struct E5M2 {
  using storage = uint8_t;
  static constexpr bool kScaled = true;
  static constexpr float kRawScale = 1.0f;
  // e5m2 is the top byte of an fp16.
  static VLLM_METAL_INLINE float to_float(uint8_t c) {
    return F16::to_float(static_cast<uint16_t>(c << 8));
  }
};

// turboquant_k8v4 (KvQuant::K8V4): E4M3's key rows, R4's value rows; read by
// the pieces kernel only (decode_row.inc widens the value rows whole).
struct K8V4 : E4M3 {};

// OCP microscaling (MXFP4) block scale: 2^(e - 127), read-only. e = 0 is
// 2^-127 (a float denormal); e = 255 overflows to inf, as MLX decodes it.
struct E8M0 {
  using storage = uint8_t;
  static VLLM_METAL_INLINE float to_float(uint8_t e) {
    return e == 0 ? 0x1p-127f : bit_cast<float>(static_cast<uint32_t>(e) << 23);
  }
};

// The 16 values of an FP4 (e2m1) code: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline constexpr float kFp4Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^x for x <= 0, exact to ~2 ulp; x < -126 (and -inf) gives exactly 0.
// Round to nearest integer n, then 2^f for f in [-0.5, 0.5] by its Taylor
// series to degree 7 (truncation error < 1e-8 relative).
VLLM_METAL_INLINE float exp2_nonpositive(float x) {
  float xc = x < -126.0f ? -126.0f : x;
  float r = (xc + 12582912.0f) - 12582912.0f; // 1.5 * 2^23 rounds to integer
  float f = xc - r;
  float p = 1.5252733804059841e-05f;
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428443e-03f;
  p = p * f + 9.6181291076284772e-03f;
  p = p * f + 5.5504108664821580e-02f;
  p = p * f + 2.4022650695910071e-01f;
  p = p * f + 6.9314718055994531e-01f;
  p = p * f + 1.0f;
  int32_t n = static_cast<int32_t>(r);
  float scale = bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
  return x < -126.0f ? 0.0f : p * scale;
}

// The largest of x[0:n] (-inf for n = 0); NaN never wins.
VLLM_METAL_INLINE float row_max(const float* __restrict x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// dst[0:n] = float(src[0:n]) * mul
template <typename T>
VLLM_METAL_INLINE void decode_span(
    const typename T::storage* __restrict src,
    float* __restrict dst,
    int64_t n,
    float mul = 1.0f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = T::to_float(src[i]) * mul;
  }
}

// dst[0:n] = T(src[0:n] * mul)
template <typename T>
VLLM_METAL_INLINE void encode_span(
    const float* __restrict src,
    typename T::storage* __restrict dst,
    int64_t n,
    float mul) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = T::from_float(src[i] * mul);
  }
}

// Reductions below keep 16 independent lanes and finish with a tree, because
// compilers otherwise end every `omp simd` reduction with a serial chain of
// 16 scalar adds, which dominated the kernel's run time.
constexpr int kLanes = 16;

VLLM_METAL_INLINE float tree_sum(float* __restrict p) {
#pragma omp simd
  for (int l = 0; l < 8; ++l) p[l] += p[l + 8];
#pragma omp simd
  for (int l = 0; l < 4; ++l) p[l] += p[l + 4];
  return (p[0] + p[2]) + (p[1] + p[3]);
}

VLLM_METAL_INLINE float tree_max(float* __restrict p) {
#pragma omp simd
  for (int l = 0; l < 8; ++l) p[l] = p[l] > p[l + 8] ? p[l] : p[l + 8];
#pragma omp simd
  for (int l = 0; l < 4; ++l) p[l] = p[l] > p[l + 4] ? p[l] : p[l + 4];
  float a = p[0] > p[2] ? p[0] : p[2];
  float b = p[1] > p[3] ? p[1] : p[3];
  return a > b ? a : b;
}

// s[j] = dot(q, k[j]) for j in [0, nk); rows of k are ld floats apart.
// Four keys at a time: four independent accumulator chains share each q load.
template <int D>
VLLM_METAL_INLINE void dot_rows(
    const float* __restrict q,
    const float* __restrict k,
    int64_t ld,
    int nk,
    float* __restrict s,
    int d) {
  const int n = D ? D : d;
  const int n16 = n - n % kLanes;
  int j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float* k0 = k + j * ld;
    const float* k1 = k0 + ld;
    const float* k2 = k1 + ld;
    const float* k3 = k2 + ld;
    float p0[kLanes] = {}, p1[kLanes] = {}, p2[kLanes] = {}, p3[kLanes] = {};
    for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        const float qv = q[c + l];
        p0[l] += qv * k0[c + l];
        p1[l] += qv * k1[c + l];
        p2[l] += qv * k2[c + l];
        p3[l] += qv * k3[c + l];
      }
    }
    for (int c = n16; c < n; ++c) { // head sizes that are not a multiple of 16
      p0[0] += q[c] * k0[c];
      p1[0] += q[c] * k1[c];
      p2[0] += q[c] * k2[c];
      p3[0] += q[c] * k3[c];
    }
    s[j] = tree_sum(p0);
    s[j + 1] = tree_sum(p1);
    s[j + 2] = tree_sum(p2);
    s[j + 3] = tree_sum(p3);
  }
  for (; j < nk; ++j) {
    const float* k0 = k + j * ld;
    float p0[kLanes] = {};
    for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        p0[l] += q[c + l] * k0[c + l];
      }
    }
    for (int c = n16; c < n; ++c) {
      p0[0] += q[c] * k0[c];
    }
    s[j] = tree_sum(p0);
  }
}

// Max of x[0:n16], n16 a multiple of 16 (callers pad with -inf).
VLLM_METAL_INLINE float max_padded(const float* __restrict x, int n16) {
  float p[kLanes];
#pragma omp simd
  for (int l = 0; l < kLanes; ++l) p[l] = x[l];
  for (int c = kLanes; c < n16; c += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) p[l] = p[l] > x[c + l] ? p[l] : x[c + l];
  }
  return tree_max(p);
}

// x[j] = 2^(x[j] - m) over x[0:n16] (padding -inf becomes 0); returns the sum.
VLLM_METAL_INLINE float exp2_shifted_padded(float* __restrict x, int n16, float m) {
  float p[kLanes] = {};
  for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp2_nonpositive(x[c + l] - m);
      x[c + l] = e;
      p[l] += e;
    }
  }
  return tree_sum(p);
}

// acc[0:d] *= a
template <int D>
VLLM_METAL_INLINE void scale_row(float* __restrict acc, float a, int d) {
  const int n = D ? D : d;
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    acc[i] *= a;
  }
}

// acc[0:d] += sum_j p[j] * v[j][0:d] (rows of v ld floats apart); four rows
// per pass so acc is loaded and stored once per four value rows.
template <int D>
VLLM_METAL_INLINE void accumulate_rows(
    const float* __restrict p,
    const float* __restrict v,
    int64_t ld,
    int nk,
    float* __restrict acc,
    int d) {
  const int n = D ? D : d;
  int j = 0;
  for (; j + 4 <= nk; j += 4) {
    const float* v0 = v + j * ld;
    const float* v1 = v0 + ld;
    const float* v2 = v1 + ld;
    const float* v3 = v2 + ld;
    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      acc[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i];
    }
  }
  for (; j < nk; ++j) {
    const float* vj = v + j * ld;
    const float pj = p[j];
#pragma omp simd
    for (int i = 0; i < n; ++i) {
      acc[i] += pj * vj[i];
    }
  }
}

} // namespace vllm_metal::cpu
