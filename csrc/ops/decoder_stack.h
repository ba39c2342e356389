// decoder_stack: a decoder stack of pre-/post-norm attention and gated-MLP blocks (every
// layer, then the final norm) as one CPU primitive. See cpu/decoder_stack/decoder_stack_cpu.h for why.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "kv_quant.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"
#include "ops/decoder_stack_lora.h"
#include "ops/decoder_stack_moe.h"
#include "ops/stack_linears.h"

namespace vllm_metal {

// Per-layer spec, flattened. ints (kStackLayerInts per layer):
//   for each linear of q, k, v, o, gate, up, down: its kLinearInts (stack_linears.h)
//   then qk_norm (StackQkNorm), rope_dims (0: no rotation), rope_traditional,
//   rope_has_freqs, sliding_window, norms (StackNorms bits), activation (StackActivation),
//   has_sinks
// floats (kStackLayerFloats per layer):
//   input_eps, post_eps (pre-MLP), qk_eps, rope_base, rope_scale, attn_scale, softcap,
//   post_attn_eps, post_mlp_eps, residual_scale
// arrays, per layer in this order:
//   [input_norm_w]; each linear as w [+ scales [+ biases] if quantized] [+ bias];
//   (q, k, v, o); [q_norm_w, k_norm_w]; [post_attn_norm_w]; [post_norm_w];
//   (gate, up, down); [post_mlp_norm_w]; [rope freqs float [rope_dims / 2]];
//   [sinks float32 [num_heads]]
// A mixture-of-experts layer (listed in moe_layers, its DecoderStackMoe in moe)
// gives gate, up and down bits -1 and no arrays.
inline constexpr int kStackLinears = 7;
inline constexpr int kStackLayerInts = stack_spec::kLinearInts * kStackLinears + 8;
inline constexpr int kStackLayerFloats = 10;

/**
 * A model's decoder weights, validated and resolved to raw views once at load,
 * so that a step passes only the activations, caches and metadata. Holds the
 * arrays (evaluated, row-contiguous), keeping their memory alive.
 */
class DecoderStackWeights {
 public:
  DecoderStackWeights(
      std::vector<mlx::core::array> arrays,
      std::vector<int> ints,
      std::vector<float> floats,
      mlx::core::array final_norm,
      float final_eps,
      int hidden,
      int num_heads,
      int num_kv_heads,
      int head_dim,
      bool int8_activations = false,
      std::vector<int> moe_layers = {},
      std::vector<std::shared_ptr<DecoderStackMoe>> moe = {},
      bool gathered = false);

  int num_layers() const {
    return static_cast<int>(layers_.size());
  }
  int hidden() const {
    return hidden_;
  }
  int num_heads() const {
    return num_heads_;
  }
  int num_kv_heads() const {
    return num_kv_heads_;
  }
  int head_dim() const {
    return head_dim_;
  }
  // Tensor parallel with gathered output projections: this rank's heads and MLP
  // columns, o and down whole (their inputs are every rank's slices, gathered
  // between segments: decoder_stack's begin and end).
  bool gathered() const {
    return gathered_;
  }
  // The layers (each step passes their caches); the final norm.
  const std::vector<cpu::StackLayer>& layers() const {
    return layers_;
  }
  const cpu::StackNorm& final_norm() const {
    return final_norm_view_;
  }
  // How many of the layers' linears form their biases from a zero point
  // (stack_spec::linear_of) instead of reading them.
  int symmetric_linears() const;

 private:
  std::vector<mlx::core::array> arrays_;
  std::vector<std::shared_ptr<DecoderStackMoe>> moe_;
  mlx::core::array final_norm_;
  std::vector<cpu::StackLayer> layers_;
  cpu::StackNorm final_norm_view_{};
  int hidden_, num_heads_, num_kv_heads_, head_dim_;
  bool gathered_;
};

/**
 * x              float32 [1, T, hidden] token embeddings
 * key_caches, value_caches  one per layer, float32/float16/bfloat16
 *                [num_blocks, block_size, num_kv_heads, head_dim], all one
 *                shape and dtype, row-contiguous
 * positions      int32 [T]; seq_lens int32 [S]; cu_seqlens_q int32 [S + 1]
 * slot_mappings, block_tables  one per KV cache group: int32 [T] and
 *                int32 [S, max_blocks_g] (as ops.paged_attention)
 * layer_groups   each layer's group (an index into the two lists)
 * lora           the resident adapters (DecoderStackLora, resolved for these
 *                weights), or null: no LoRA update this step
 * lora_rows      with lora: integer [T], each row's adapter slot (-1: none)
 * kv_quant       a KvQuant: with one, the caches are uint8 [num_blocks,
 *                block_size, num_kv_heads, head_dim + 4] (kv_quant.h)
 * key_columns    float caches: key caches [num_blocks, num_kv_heads,
 *                head_dim, block_size] (ops/paged_attention.h)
 * returns        [hidden_out [1, T, hidden]] (after the final norm, where the
 *                weights hold one: a pipeline stage before the last has none).
 * begin, end     a segment of the work, for tensor parallel with gathered output
 *                projections (weights built with gathered = true): from begin to
 *                end, each (layer, StackAt): 0 the layer's start, 1 before o (its
 *                input: the attention output), 2 before down (its input: the gated
 *                MLP columns); end (-1, 0) runs through the last layer and the
 *                final norm (the default: the whole stack, from (0, 0)).
 * carry          begun at o or down: that projection's whole input, float32
 *                [1, T, in_features] (every rank's slice, gathered)
 *                Ended at o or down, returns [residual stream [1, T, hidden],
 *                this rank's slice of that projection's input [1, T, width]].
 *                No LoRA in a segment.
 * rope_angles    float32 [2, T, rope_dims / 2]: cos then sin of each row's rotary
 *                angles, used by every rotating layer instead of those formed from
 *                positions (M-RoPE, whose frequencies read three positions; the
 *                layers must all rotate rope_dims). positions then only name rows.
 * key_ends       int32 [T]: each row's key end in every layer's attention
 *                (paged_attention's key_ends: bidirectional spans).
 *
 * The new keys and values are written into the caches' own buffers, which are
 * neither outputs nor inputs of the node but held by the primitive (lazy ones
 * are evaluated first). As outputs, MLX builds every output of a node with
 * its own copy of the input and sibling lists: 2 x layers of them cost the
 * host ~0.5 ms per step (measured, 30 layers). As inputs, each costs the host
 * a hash-set insert and a reference count per evaluation and the stream
 * thread the matching release (60 caches: ~50 us of host time per step).
 * Whatever reads the caches later must be enqueued on the same stream after
 * this node (the model runner's steps are; the CPU stream runs in order).
 */
std::vector<mlx::core::array> decoder_stack(
    std::shared_ptr<DecoderStackWeights> weights,
    const mlx::core::array& x,
    const std::vector<mlx::core::array>& key_caches,
    const std::vector<mlx::core::array>& value_caches,
    const mlx::core::array& positions,
    const std::vector<mlx::core::array>& slot_mappings,
    const std::vector<mlx::core::array>& block_tables,
    const mlx::core::array& seq_lens,
    const mlx::core::array& cu_seqlens_q,
    const std::vector<int>& layer_groups,
    std::shared_ptr<DecoderStackLora> lora = nullptr,
    const std::optional<mlx::core::array>& lora_rows = std::nullopt,
    int kv_quant = 0,
    bool key_columns = false,
    std::pair<int, int> begin = {0, cpu::kLayerStart},
    std::pair<int, int> end = {-1, cpu::kLayerStart},
    const std::optional<mlx::core::array>& carry = std::nullopt,
    const std::optional<mlx::core::array>& rope_angles = std::nullopt,
    const std::optional<mlx::core::array>& key_ends = std::nullopt,
    mlx::core::StreamOrDevice s = {});

class DecoderStack : public CpuOnlyPrimitive {
 public:
  // caches: every layer's key cache, then every layer's value cache.
  // lora: as decoder_stack's; with it, lora_rows is the node's last input.
  // begin, end: the segment the node runs (decoder_stack); begun mid-layer, the
  // carry follows lora_rows. rope_angles: the rotary angles follow; key_ends: the
  // rows' key ends are the last input.
  DecoderStack(mlx::core::Stream stream, std::shared_ptr<DecoderStackWeights> weights,
               std::vector<mlx::core::array> caches, std::vector<int> layer_groups,
               std::shared_ptr<const DecoderStackLora> lora, KvQuant kv_quant, bool key_columns,
               cpu::StackPoint begin = {0, cpu::kLayerStart},
               cpu::StackPoint end = {-1, cpu::kLayerStart}, bool rope_angles = false,
               bool key_ends = false)
      : CpuOnlyPrimitive(stream, "the model runs module by module"),
        weights_(std::move(weights)),
        caches_(std::make_shared<const std::vector<mlx::core::array>>(std::move(caches))),
        layer_groups_(std::move(layer_groups)),
        lora_(std::move(lora)),
        kv_quant_(kv_quant),
        key_columns_(key_columns),
        begin_(begin),
        end_(end),
        rope_angles_(rope_angles),
        key_ends_(key_ends) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalDecoderStack";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  std::shared_ptr<DecoderStackWeights> weights_;
  // Shared with each dispatched task: one reference keeps them all alive.
  std::shared_ptr<const std::vector<mlx::core::array>> caches_;
  std::vector<int> layer_groups_;
  std::shared_ptr<const DecoderStackLora> lora_;
  KvQuant kv_quant_;
  bool key_columns_;
  cpu::StackPoint begin_, end_;
  bool rope_angles_;
  bool key_ends_;
};

} // namespace vllm_metal
