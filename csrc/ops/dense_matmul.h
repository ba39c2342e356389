// dense_matmul: x @ W.T with W in float32, bfloat16 or float16.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * Dense linear layer (nn.Linear, a tied embedding used as the head).
 *
 *   x        [..., K] float32/bfloat16/float16
 *   w        [N, K] float32/bfloat16/float16 (widened to fp32 in registers)
 *   bias     optional [N] float, added to every output row
 *   returns  [..., N] accumulated in float32, in MLX's promotion of x's,
 *            w's (and the bias') dtypes: x's dtype when they agree
 */
mlx::core::array dense_matmul(
    const mlx::core::array& x,
    const mlx::core::array& w,
    const std::optional<mlx::core::array>& bias = std::nullopt,
    mlx::core::StreamOrDevice s = {});

class DenseMatmul : public CpuOnlyPrimitive {
 public:
  DenseMatmul(mlx::core::Stream stream, bool has_bias)
      : CpuOnlyPrimitive(stream, "use x @ w.T (run this op on the CPU stream: stream=mx.cpu)"), has_bias_(has_bias) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalDenseMatmul";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  bool has_bias_;
};

} // namespace vllm_metal
