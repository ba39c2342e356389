// sample_tokens: one token per row of logits (argmax or a categorical draw).
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * One token per row, the sampler's last step on the CPU backend.
 *
 *   logits       float [R, V] (computed in float32)
 *   temperature  float32 [R]: > 0 draws from softmax(logits / T); <= 0 takes the
 *                argmax (first index of the row's max)
 *   keys         uint32 [R, 2]: the row's random key; the draw is the inverse
 *                CDF at u = key_uniform(key) (csrc/cpu/sampling/sample_cpu.h)
 *   min_p        optional float32 [R]: drop tokens below min_p x the top probability
 *   top_k        optional int32 [R]: keep the k largest (ties kept; <= 0 or >= V: off)
 *   top_p        optional float32 [R]: keep the fewest largest holding top_p of
 *                the mass left (ties kept; >= 1: off); applied in this order,
 *                on temperature-scaled probabilities, to rows with T > 0
 *   allowed      optional uint32 [R, >= ceil(V / 32)]: a grammar's bitmask, bit
 *                c % 32 of word c / 32 admitting token c; the others count as
 *                -inf logits (for the draw and the argmax alike)
 *   returns      int32 [R]
 *
 * Tokens with -inf logits are never drawn. A row of only -inf/NaN gives 0.
 */
mlx::core::array sample_tokens(
    const mlx::core::array& logits,
    const mlx::core::array& temperature,
    const mlx::core::array& keys,
    const std::optional<mlx::core::array>& min_p = std::nullopt,
    const std::optional<mlx::core::array>& top_k = std::nullopt,
    const std::optional<mlx::core::array>& top_p = std::nullopt,
    const std::optional<mlx::core::array>& allowed = std::nullopt,
    mlx::core::StreamOrDevice s = {});

class SampleTokens : public CpuOnlyPrimitive {
 public:
  // has_*: which optional inputs follow logits, temperature and keys, in order.
  SampleTokens(mlx::core::Stream stream, bool has_min_p, bool has_top_k, bool has_top_p,
               bool has_allowed)
      : CpuOnlyPrimitive(stream, "the sampler draws with MLX's own ops (run this op on the CPU stream: stream=mx.cpu)"),
        has_min_p_(has_min_p),
        has_top_k_(has_top_k),
        has_top_p_(has_top_p),
        has_allowed_(has_allowed) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalSampleTokens";
  }
  // A pure function of its inputs (the keys carry the randomness).
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  bool has_min_p_;
  bool has_top_k_;
  bool has_top_p_;
  bool has_allowed_;
};

} // namespace vllm_metal
