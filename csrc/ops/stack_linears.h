// How the decoder stack's specs (ops/decoder_stack.h, ops/decoder_stack_moe.h)
// name a linear layer: kLinearInts ints and its arrays' places in a flat list;
// checked once at load and resolved to a cpu::StackLinear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "mlx/array.h"

namespace vllm_metal::stack_spec {

[[noreturn]] void fail(const std::string& msg);  // std::invalid_argument "decoder_stack: ..."

// A linear's spec: bits (0 = dense), group_size, has_bias, zero_point. A zero
// point z > 0 marks symmetric weights (GGUF's Q4_0, Q8_0: each bias is -z x its
// scale): no biases array is passed, the int8 kernels form each bias from its
// scale, so a pass over W streams no biases (for 4 bits a ninth fewer bytes).
// Python finds the symmetry once, on the module (fast_linears._find_zero_point).
inline constexpr int kLinearInts = 4;

struct LinearIndex {
  int w = -1, scales = -1, biases = -1, bias = -1;
  int bits = 0, group_size = 0, zero_point = 0;
};

// The linear described by spec[0..kLinearInts), its arrays taken from position
// `next` on (w, then scales and, unless symmetric, biases if quantized, then
// bias): next advances past them.
LinearIndex take_linear(const int* spec, int& next);

// In features of w (a quantized w packs 32 / bits per uint32).
int64_t linear_in(const mlx::core::array& w, int bits);

// Throws unless the linear is [n, k] (dense float, or MLX affine 4/8-bit, a
// zero point only 2^(bits - 1)).
void check_linear(const std::vector<mlx::core::array>& arrays, const LinearIndex& x, int64_t n,
                  int64_t k, const std::string& where);

// With int8 activations a quantized linear's arrays are in the int8 kernels'
// tile order (cpu::QuantMatrix::tiled), as vllm_metal.cpu.fast_linears stores
// them in that mode. A symmetric linear needs int8 activations (throws otherwise:
// the float kernels read biases).
cpu::StackLinear linear_of(const std::vector<mlx::core::array>& arrays, const LinearIndex& x,
                           bool int8_activations);

} // namespace vllm_metal::stack_spec
