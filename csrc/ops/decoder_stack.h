// decoder_stack: a llama-family decoder stack (every layer, then the final
// norm) as one CPU primitive. See cpu/decoder_stack_cpu.h for why.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

// Per-layer spec, flattened. ints (kStackLayerInts per layer):
//   for each linear of q, k, v, o, gate, up, down: bits (0 = dense), group_size, has_bias
//   then has_qk_norm, rope_dims, rope_traditional, rope_has_freqs, sliding_window
// floats (kStackLayerFloats per layer):
//   input_eps, post_eps, qk_eps, rope_base, rope_scale, attn_scale, softcap
// arrays, per layer in this order:
//   input_norm_w; each linear as w [+ scales, biases if quantized] [+ bias];
//   (q, k, v, o); [q_norm_w, k_norm_w]; post_norm_w; (gate, up, down);
//   [rope freqs float [rope_dims / 2]]; key_cache; value_cache
inline constexpr int kStackLinears = 7;
inline constexpr int kStackLayerInts = 3 * kStackLinears + 5;
inline constexpr int kStackLayerFloats = 7;

/**
 * x              float32 [1, T, hidden] token embeddings
 * final_norm     [hidden] weight of the final RMSNorm, eps final_eps
 * positions, slot_mapping  int32 [T]; block_tables int32 [S, max_blocks];
 * seq_lens int32 [S]; cu_seqlens_q int32 [S + 1]  (as ops.paged_attention)
 * caches         float32 [num_blocks, block_size, num_kv_heads, head_dim]
 * returns        [hidden_out [1, T, hidden], key_cache_0, value_cache_0, ...]:
 *                the caches alias the inputs' buffers (written in place)
 */
std::vector<mlx::core::array> decoder_stack(
    const mlx::core::array& x,
    const std::vector<mlx::core::array>& arrays,
    const std::vector<int>& ints,
    const std::vector<float>& floats,
    const mlx::core::array& final_norm,
    float final_eps,
    const mlx::core::array& positions,
    const mlx::core::array& slot_mapping,
    const mlx::core::array& block_tables,
    const mlx::core::array& seq_lens,
    const mlx::core::array& cu_seqlens_q,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    mlx::core::StreamOrDevice s = {});

class DecoderStack : public mlx::core::Primitive {
 public:
  DecoderStack(mlx::core::Stream stream, std::vector<int> ints, std::vector<float> floats,
               float final_eps, int num_heads, int num_kv_heads, int head_dim)
      : mlx::core::Primitive(stream),
        ints_(std::move(ints)),
        floats_(std::move(floats)),
        final_eps_(final_eps),
        num_heads_(num_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalDecoderStack";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  std::vector<int> ints_;
  std::vector<float> floats_;
  float final_eps_;
  int num_heads_;
  int num_kv_heads_;
  int head_dim_;
};

} // namespace vllm_metal
