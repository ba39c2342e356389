// Elementwise activations in fp32 with no libm call, so each loop vectorizes for
// the ISA it is compiled for (the decoder stack's gated MLP and the activation op
// share these bodies). Gated: out = act(g) * u; else out = act(g).
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

enum class Activation { Silu = 0, GeluTanh = 1, Gelu = 2, GeluFast = 3 };

namespace act_detail {

constexpr float kLog2e = 1.4426950408889634f;

// silu(x) = x * sigmoid(x); sigmoid from e = exp(-|x|) <= 1 (never overflows):
// 1 / (1 + e) for x >= 0, e / (1 + e) below.
VLLM_METAL_INLINE float sigmoid(float x) {
  const float e = exp2_nonpositive(-std::fabs(x) * kLog2e);
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

VLLM_METAL_INLINE float silu(float x) {
  return x * sigmoid(x);
}

// gelu_fast(x) = x * sigmoid(1.702 x) (MLX's gelu_fast_approx, "quick_gelu").
VLLM_METAL_INLINE float gelu_fast(float x) {
  return x * sigmoid(1.702f * x);
}

// gelu_tanh(x) = x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (MLX's
// gelu_approx); tanh(y) = sign(y) (1 - e) / (1 + e) with e = exp(-2 |y|) <= 1.
VLLM_METAL_INLINE float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  const float y = kC * (x + 0.044715f * x * x * x);
  const float e = exp2_nonpositive(-2.0f * std::fabs(y) * kLog2e);
  return 0.5f * x * (1.0f + std::copysign((1.0f - e) / (1.0f + e), y));
}

// gelu(x) = x / 2 * (1 + erf(x / sqrt(2))), erf by Abramowitz and Stegun 7.1.26
// (absolute error <= 1.5e-7, below float32's step near 1), whose exp(-z^2) <= 1
// takes the vectorizable exp2.
VLLM_METAL_INLINE float gelu_erf(float x) {
  constexpr float kRsqrt2 = 0.7071067811865476f;
  constexpr float p = 0.3275911f, a1 = 0.254829592f, a2 = -0.284496736f,
                  a3 = 1.421413741f, a4 = -1.453152027f, a5 = 1.061405429f;
  const float z = std::fabs(x) * kRsqrt2;
  const float t = 1.0f / (1.0f + p * z);
  const float poly = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5))));
  const float erf_abs = 1.0f - poly * exp2_nonpositive(-z * z * kLog2e);
  return 0.5f * x * (1.0f + std::copysign(erf_abs, x));
}

} // namespace act_detail

// out[i] = act(g[i]) (* u[i] when Gated) for i < n; out may be g.
template <Activation A, bool Gated>
VLLM_METAL_INLINE void activation_span(const float* g, const float* __restrict u,
                                       float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float y;
    if constexpr (A == Activation::Silu) {
      y = act_detail::silu(g[i]);
    } else if constexpr (A == Activation::GeluTanh) {
      y = act_detail::gelu_tanh(g[i]);
    } else if constexpr (A == Activation::GeluFast) {
      y = act_detail::gelu_fast(g[i]);
    } else {
      y = act_detail::gelu_erf(g[i]);
    }
    out[i] = Gated ? y * u[i] : y;
  }
}

} // namespace vllm_metal::cpu
