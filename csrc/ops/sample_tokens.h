// sample_tokens: one token per row of logits (argmax or a categorical draw).
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * One token per row, the sampler's last step on the CPU backend.
 *
 *   logits       float [R, V] (computed in float32)
 *   temperature  float32 [R]: > 0 draws from softmax(logits / T); <= 0 takes the
 *                argmax (first index of the row's max)
 *   keys         uint32 [R, 2]: the row's random key; the draw is the inverse
 *                CDF at u = key_uniform(key) (csrc/cpu/sample_cpu.h)
 *   returns      int32 [R]
 *
 * Tokens with -inf logits are never drawn. A row of only -inf/NaN gives 0.
 */
mlx::core::array sample_tokens(
    const mlx::core::array& logits,
    const mlx::core::array& temperature,
    const mlx::core::array& keys,
    mlx::core::StreamOrDevice s = {});

class SampleTokens : public mlx::core::Primitive {
 public:
  explicit SampleTokens(mlx::core::Stream stream) : mlx::core::Primitive(stream) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalSampleTokens";
  }
  bool is_equivalent(const mlx::core::Primitive& /* other */) const override {
    return true;   // a pure function of its inputs (the keys carry the randomness)
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;
};

} // namespace vllm_metal
