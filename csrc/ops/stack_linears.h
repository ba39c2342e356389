// How the decoder stack's specs (ops/decoder_stack.h, ops/decoder_stack_moe.h)
// name a linear layer: (bits, group_size, has_bias) ints and its arrays' places
// in a flat list; checked once at load and resolved to a cpu::StackLinear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "mlx/array.h"

namespace vllm_metal::stack_spec {

[[noreturn]] void fail(const std::string& msg);  // std::invalid_argument "decoder_stack: ..."

struct LinearIndex {
  int w = -1, scales = -1, biases = -1, bias = -1;
  int bits = 0, group_size = 0;
};

// The linear described by spec[0..3) = (bits, group_size, has_bias), its arrays
// taken from position `next` on (w, then scales and biases if quantized, then
// bias): next advances past them.
LinearIndex take_linear(const int* spec, int& next);

// In features of w (a quantized w packs 32 / bits per uint32).
int64_t linear_in(const mlx::core::array& w, int bits);

// Throws unless the linear is [n, k] (dense float, or MLX affine 4/8-bit).
void check_linear(const std::vector<mlx::core::array>& arrays, const LinearIndex& x, int64_t n,
                  int64_t k, const std::string& where);

// With int8 activations a quantized linear's arrays are in the int8 kernels'
// tile order (cpu::QuantMatrix::tiled), as vllm_metal.cpu.fast_linears stores
// them in that mode.
cpu::StackLinear linear_of(const std::vector<mlx::core::array>& arrays, const LinearIndex& x,
                           bool int8_activations);

} // namespace vllm_metal::stack_spec
