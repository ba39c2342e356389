// The mixture-of-experts MLP of one decoder-stack layer (cpu/decoder_stack/
// moe_block.h), validated and resolved to raw views once at load; a
// DecoderStackWeights holds one per MoE layer.
#pragma once

#include <vector>

#include "cpu/decoder_stack/moe_block.h"
#include "mlx/array.h"
#include "ops/stack_linears.h"

namespace vllm_metal {

// ints (kMoeInts):
//   top_k, scoring (cpu::MoeScoring), normalize, has_shared, has_shared_gate,
//   router (its stack_spec::kLinearInts),
//   gate, up and down experts (bits (0: float), group_size, mxfp4, has_bias each: GGUF
//   files store the down experts at another precision than the gate and up ones),
//   shared gate, up, down (kLinearInts each; read when has_shared),
//   shared gate projection (kLinearInts; read when has_shared_gate),
//   has_correction_bias, n_group, topk_group (Sigmoid scoring)
// arrays, in order: the router (w [+ scales [+ biases]] [+ bias]); the gate, up and
// down experts, each w [E, n, k] [+ scales [+ biases]] [+ bias [E, n]]; the shared
// expert's gate, up, down linears; the shared gate projection [1, hidden]; the
// correction bias float32 [E].
inline constexpr int kMoeInts = 5 + stack_spec::kLinearInts * 5 + 12 + 3;

class DecoderStackMoe {
 public:
  DecoderStackMoe(std::vector<mlx::core::array> arrays, std::vector<int> ints, float scale,
                  int hidden, bool int8_activations = false);

  const cpu::StackMoe& view() const {
    return view_;
  }
  int num_experts() const {
    return num_experts_;
  }

 private:
  std::vector<mlx::core::array> arrays_;
  cpu::StackMoe view_{};
  int num_experts_ = 0;
};

} // namespace vllm_metal
