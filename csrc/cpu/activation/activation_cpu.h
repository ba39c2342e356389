// CPU kernel of elementwise activations (SiLU, GELU, its tanh and sigmoid forms), fp32:
// MLX's CPU backend computes exp / erf / tanh one element at a time (GELU over a
// 1500 x 1536 activation took 80 ms here); these vectorize.
#pragma once

#include <cstdint>

#include "cpu/runtime/activations.h"

namespace vllm_metal::cpu {

// out[i] = act(x[i]) for i < n (x and out contiguous fp32; out may be x).
void activation_cpu(Activation act, const float* x, float* out, int64_t n);

} // namespace vllm_metal::cpu
