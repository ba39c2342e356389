// activation: SiLU / GELU and its approximations of a float32 array, one CPU primitive.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * Elementwise activation.
 *
 *   x      float32 [...]
 *   kind   0 silu, 1 gelu_approx (tanh form, MLX's nn.gelu_approx), 2 gelu (erf),
 *          3 gelu_fast_approx (x * sigmoid(1.702 x))
 *   returns float32 [...] (same shape)
 */
mlx::core::array activation(const mlx::core::array& x, int kind,
                            mlx::core::StreamOrDevice s = {});

class ActivationOp : public CpuOnlyPrimitive {
 public:
  ActivationOp(mlx::core::Stream stream, int kind)
      : CpuOnlyPrimitive(stream, "use mlx.nn's activations"), kind_(kind) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalActivation";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int kind_;
};

} // namespace vllm_metal
