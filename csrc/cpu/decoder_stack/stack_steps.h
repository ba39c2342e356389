// Steps of a decoder-stack layer shared by its blocks (decoder_stack_cpu.cpp,
// moe_block.cpp). fp32 rows in and out.
#pragma once

#include <cstdint>

#include "cpu/decoder_stack/decoder_stack_cpu.h"

namespace vllm_metal::cpu::stack {

// out[t, n] = x[t, :] @ W.T (+ bias).
void linear(const StackLinear& l, const float* x, int64_t t, float* out);

// g = act(g) * u over n values.
void gated(StackActivation act, float* g, const float* u, int64_t n);

} // namespace vllm_metal::cpu::stack
