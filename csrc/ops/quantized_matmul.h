// quantized_matmul: x @ W.T against an MLX affine-quantized W.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * Matmul against MLX's affine quantization (mx.quantize, nn.QuantizedLinear).
 *
 *   x        [..., K] float32/bfloat16/float16
 *   w        uint32 [N, K * bits / 32], bits-wide fields, lowest bits first
 *   scales   [N, K / group_size] float32/bfloat16/float16
 *   biases   same shape and dtype as scales; W[n, k] = scale * q + bias.
 *            Or none, for symmetric weights (GGUF's Q8_0, Q4_0): each bias is
 *            then -zero_point * scale and never read from memory; only with
 *            int8_activations
 *   bias     optional [N] float, added to every output row
 *   returns  [..., N] accumulated in float32, in MLX's promotion of x's,
 *            the scales' (and the bias') dtypes: x's dtype when they agree
 *
 * bits is 4 or 8, group_size 32, 64 or 128. int8_activations rounds x to
 * int8 per 32 columns and multiplies in integers (cpu/linear/linear_q8.h).
 *
 * argmax_columns > 0 (at most N; the result type must be float32): returns
 * int32 [...] instead, each row's mx.argmax over its first argmax_columns
 * products (cpu/linear/row_argmax.h) — greedy decoding without a logits node.
 * argmax_allowed (with argmax_columns only): uint32 [..., W], W >= ceil(columns /
 * 32), x's leading shape: a grammar's bitmask; the columns whose bit is clear
 * count as -inf (constrained greedy decoding, still without a logits node).
 *
 * tiled (with int8_activations only): w, scales and biases hold their
 * elements in the int8 GEMM's tile order (cpu::QuantMatrix, linear_cpu.h;
 * vllm_metal.ops.linear.tile_quantized), shapes unchanged. The products are
 * the same bits as from MLX's layout; read in place, a few rows go faster.
 */
mlx::core::array quantized_matmul(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const mlx::core::array& scales,
    const std::optional<mlx::core::array>& biases,
    int bits,
    int group_size,
    const std::optional<mlx::core::array>& bias = std::nullopt,
    bool int8_activations = false,
    float zero_point = 0.0f,
    int argmax_columns = 0,
    const std::optional<mlx::core::array>& argmax_allowed = std::nullopt,
    bool tiled = false,
    mlx::core::StreamOrDevice s = {});

class QuantizedMatmul : public CpuOnlyPrimitive {
 public:
  // has_biases false: the biases are -zero_point * scale, not an input.
  // argmax_columns > 0: the output is each row's argmax over that many columns;
  // has_allowed: of the columns the last input admits.
  QuantizedMatmul(mlx::core::Stream stream, int bits, int group_size, bool has_bias,
                  bool int8_activations, bool has_biases, float zero_point, int argmax_columns,
                  bool has_allowed, bool tiled)
      : CpuOnlyPrimitive(stream, "use mx.quantized_matmul (run this op on the CPU stream: stream=mx.cpu)"),
        bits_(bits),
        group_size_(group_size),
        has_bias_(has_bias),
        int8_activations_(int8_activations),
        has_biases_(has_biases),
        zero_point_(zero_point),
        argmax_columns_(argmax_columns),
        has_allowed_(has_allowed),
        tiled_(tiled) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalQuantizedMatmul";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int bits_;
  int group_size_;
  bool has_bias_;
  bool int8_activations_;
  bool has_biases_;
  float zero_point_;
  int argmax_columns_;
  bool has_allowed_;
  bool tiled_;
};

} // namespace vllm_metal
