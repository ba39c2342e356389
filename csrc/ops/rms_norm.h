// rms_norm: mx.fast.rms_norm as one CPU primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * RMS normalization over the last axis (what mx.fast.rms_norm computes).
 *
 *   x       float [..., D]
 *   weight  float [D] or None
 *   returns [..., D] in MLX's promotion of x's and weight's dtypes;
 *           x * rsqrt(mean(x^2) + eps) * weight, in fp32 arithmetic
 */
mlx::core::array rms_norm(
    const mlx::core::array& x,
    const std::optional<mlx::core::array>& weight,
    float eps,
    mlx::core::StreamOrDevice s = {});

class RmsNorm : public CpuOnlyPrimitive {
 public:
  RmsNorm(mlx::core::Stream stream, float eps) : CpuOnlyPrimitive(stream, "use mx.fast.rms_norm"), eps_(eps) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalRmsNorm";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  float eps_;
};

} // namespace vllm_metal
