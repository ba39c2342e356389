// DecoderStackLora: the LoRA adapters the decoder stack adds, resolved once per
// change of the resident adapters rather than passed with every step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "mlx/array.h"

namespace vllm_metal {

class DecoderStackWeights;

// Ints per site in a DecoderStackLora's table: layer, projection
// (cpu::StackProjection), module (an index into the modules), b_col0.
inline constexpr int kStackLoraInts = 4;

/**
 * The adapter stacks of every site (one projection of one layer that takes
 * adapters), validated against the model's weights and resolved to raw views.
 *
 * table    kStackLoraInts per site, ordered by (layer, projection); a fused
 *          linear's slices are separate sites of one module, each reading B's
 *          columns [b_col0, b_col0 + the projection's out features)
 * arrays   three per module: a [L, r, in] and b [L, r, out] (float32, bfloat16
 *          or float16, one dtype), scale float32 [L]
 * filled   L ints per module: nonzero where the slot's adapter targets the module
 *          (a row whose slot does not is not updated there)
 *
 * A step passes only each row's slot (decoder_stack's lora_rows). Holding the
 * stacks here, not as the node's inputs, is what makes an adapter cheap at one
 * row: 4 inputs per site cost MLX's evaluation ~1 ms of host time per step on a
 * 30-layer model (840 inputs), about a tenth of its decode step.
 */
class DecoderStackLora {
 public:
  DecoderStackLora(std::shared_ptr<DecoderStackWeights> weights, std::vector<int> table,
                   std::vector<mlx::core::array> arrays, std::vector<int> filled);

  const std::vector<cpu::StackLora>& sites() const {
    return sites_;
  }
  int num_slots() const {
    return num_slots_;
  }
  // Whether these sites were resolved against `weights`.
  bool resolved_for(const DecoderStackWeights& weights) const {
    return &weights == weights_.get();
  }

 private:
  std::shared_ptr<const DecoderStackWeights> weights_;
  std::vector<mlx::core::array> arrays_;
  std::vector<uint8_t> filled_;
  std::vector<cpu::StackLora> sites_;
  int num_slots_ = 0;
};

} // namespace vllm_metal
