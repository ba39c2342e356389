// rope: mx.fast.rope (with per-sequence offsets) as one CPU primitive.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * Rotary position embedding, as mx.fast.rope computes it.
 *
 *   x        float [B, ..., L, D] (at least 3-D)
 *   offset   int32 [] or [B]: element (b, ..., l) sits at position offset[b] + l
 *   dims     even, <= D: features rotated; the rest pass through
 *   base     angular base (inv_freq[i] = base^(-2i/dims)), or
 *   freqs    float [dims / 2] periods (inv_freq[i] = 1 / freqs[i]); exactly one
 *   scale    positions are multiplied by it
 *   returns  x's shape and dtype
 */
mlx::core::array rope(
    const mlx::core::array& x,
    int dims,
    bool traditional,
    std::optional<float> base,
    float scale,
    const mlx::core::array& offset,
    const std::optional<mlx::core::array>& freqs,
    mlx::core::StreamOrDevice s = {});

class Rope : public CpuOnlyPrimitive {
 public:
  Rope(mlx::core::Stream stream, int dims, bool traditional, float base, float scale)
      : CpuOnlyPrimitive(stream, "use mx.fast.rope"),
        dims_(dims),
        traditional_(traditional),
        base_(base),
        scale_(scale) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalRope";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int dims_;
  bool traditional_;
  float base_;  // 0 when freqs is an input
  float scale_;
};

} // namespace vllm_metal
