// top_logprobs: a token's score, its rank and the top-k scores of each row.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * The logprobs columns vLLM returns, on the CPU backend (csrc/cpu/sampling/logprobs_cpu.h).
 *
 *   x          float [R, V] (computed in float32): logits
 *   token      integer [R]: the sampled (or target) token of each row
 *   k          >= 0: top scores per row
 *   normalize  scores are log_softmax(x) (else x itself)
 *   returns    {ids int32 [R, k + 1], vals float32 [R, k + 1], ranks int32 [R]}:
 *              column 0 the token, columns 1.. the top-k (descending, ties by
 *              lower id, padded with id 0 / -inf past V); rank = 1 + the
 *              number of other scores >= the token's
 *
 * A token outside [0, V) raises when the result is evaluated.
 */
std::vector<mlx::core::array> top_logprobs(
    const mlx::core::array& x,
    const mlx::core::array& token,
    int k,
    bool normalize,
    mlx::core::StreamOrDevice s = {});

class TopLogprobs : public CpuOnlyPrimitive {
 public:
  TopLogprobs(mlx::core::Stream stream, int k, bool normalize)
      : CpuOnlyPrimitive(stream, "the sampler uses MLX's own ops (run this op on the CPU stream: stream=mx.cpu)"), k_(k), normalize_(normalize) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalTopLogprobs";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int k_;
  bool normalize_;
};

} // namespace vllm_metal
