// The whole pre-norm decoder stack of a llama-family model in one CPU pass.
//
// On MLX's CPU backend every graph node costs the host thread ~10 us to
// enqueue, and a 30-layer decode step built from modules is ~900 nodes: the
// enqueueing, not the arithmetic, bounds the step. This runs the stack as one
// task on the stream thread with the extension's kernels (matmuls, norm,
// RoPE, paged attention) and the thread pool.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/linear/linear_cpu.h"
#include "cpu/attention/paged_attention_cpu.h"

namespace vllm_metal::cpu {

// One linear layer: dense (quant.bits == 0, dense.w set) or MLX-quantized.
struct StackLinear {
  DenseMatrix dense{};
  QuantMatrix quant{};
  const void* bias = nullptr; // [n] or nullptr
  Elem bias_type = Elem::F32;
  bool int8_activations = false; // quantized only (LinearIO::int8_activations)

  int64_t out_features() const {
    return quant.bits ? quant.n : dense.n;
  }
  int64_t in_features() const {
    return quant.bits ? quant.k : dense.k;
  }
};

struct StackNorm {
  const void* w; // [d]
  Elem type;
  float eps;
};

// Which RMSNorms a block applies (StackLayer::norms), as families place them:
// llama pre-attention and pre-MLP; Gemma 2/3 and GLM-4 also after each sublayer
// (on its output, before the residual add); OLMo 2 only after.
enum StackNorms : int {
  kPreAttention = 1,
  kPostAttention = 2,
  kPreMlp = 4,
  kPostMlp = 8,
};

// Gated MLP: down(act(gate(y)) * up(y)); GELU exact (erf) or its tanh approximation.
// SwigluOai (gpt-oss): g = min(g, 7), u = clamp(u, -7, 7), g * sigmoid(1.702 g) * (u + 1).
enum class StackActivation : int { Silu = 0, GeluTanh = 1, Gelu = 2, SwigluOai = 3 };
inline constexpr float kSwigluOaiAlpha = 1.702f, kSwigluOaiLimit = 7.0f;

// q/k RMSNorm: none, per head (over head_dim), or across heads (over the whole
// projection, as OLMo 2 does).
enum class StackQkNorm : int { None = 0, PerHead = 1, AcrossHeads = 2 };

// x -> x + s * post_attn(attn(pre_attn(x))); x -> x + s * post_mlp(mlp(pre_mlp(x))),
// each norm present or not (`norms`), s the residual scale (Granite's
// residual_multiplier, else 1), attention on paged caches (fp32, or fp16/bf16:
// keys and values are rounded once, when written).
struct StackMoe;  // cpu/decoder_stack/moe_block.h

struct StackLayer {
  int norms = kPreAttention | kPreMlp;
  StackNorm input_norm{};      // pre-attention
  StackLinear q, k, v, o;
  StackQkNorm qk_norm = StackQkNorm::None;
  StackNorm q_norm{}, k_norm{}; // [head_dim] per head, or [heads * head_dim] across
  StackNorm post_attn_norm{};
  StackNorm post_norm{};        // pre-MLP
  StackLinear gate, up, down;   // unused when moe is set
  const StackMoe* moe = nullptr; // a mixture-of-experts MLP instead (held by its owner)
  StackNorm post_mlp_norm{};
  StackActivation activation = StackActivation::Silu;
  float residual_scale = 1.0f;
  // RoPE (see RopeArgs): inv_freq from base or freqs (float32 [dims / 2]);
  // rope_dims 0: the layer has no positional rotation (NoPE).
  int rope_dims;
  bool rope_traditional;
  double rope_base;
  const float* rope_freqs; // nullptr: base
  double rope_scale;
  float attn_scale;
  int sliding_window; // 0: full context
  float softcap;      // 0: off
  const float* sinks = nullptr; // [num_heads]: attention sinks (gpt-oss), or none
};

// A layer's projections, in the order the stack computes them.
enum StackProjection : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown };

// Where the stack adds a LoRA update (as cpu::lora_cpu computes it): to one
// projection's fp32 output right after its matmul, from the projection's fp32
// input (also with int8 activations, as the module path's LoRA layer does).
// A and B are fp32, or bf16/fp16 read as fp32 (--lora-dtype: half the bytes).
struct StackLora {
  int layer;
  int projection;         // StackProjection
  const void* a;          // [num_slots, rank, in_features]
  const void* b;          // column b_col0 of B [num_slots, rank, b_ld]: the projection's
                          // block of a fused linear's output columns (all of B otherwise)
  int64_t b_ld;
  Elem weight_type;       // of a and b
  const float* scale;     // [num_slots]
  const uint8_t* filled;  // [num_slots]: the slot's adapter targets this projection
  int64_t num_slots, rank, in_features, out_features;
};

// A point of a layer a stack segment starts or ends at (tensor parallel with
// gathered output projections: the ranks exchange the inputs of o and down there).
enum StackAt : int {
  kLayerStart = 0,
  kBeforeO = 1,     // the attention output, before o
  kBeforeDown = 2,  // the gated MLP columns, before down
};

struct StackPoint {
  int layer;
  int at;  // StackAt
};

struct StackArgs {
  const float* x;        // [t, hidden] embeddings
  float* out;            // [t, hidden] final-norm output
  int64_t t;
  int64_t hidden;
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int num_blocks;
  int block_size;
  Elem kv_type = Elem::F32;    // of every layer's caches (unless quantized)
  KvQuant kv_quant = KvQuant::None; // quantized caches: uint8 rows (kv_quant.h)
  bool key_columns = false; // float key caches [num_blocks, num_kv_heads, head_dim, block_size]
  const int32_t* positions;    // [t]
  // Rotary angles given per row, cos then sin [t, rope_dims / 2] each (M-RoPE:
  // each frequency reads its own axis's position); null: formed from positions.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  const int32_t* seq_lens;     // [num_seqs]
  const int32_t* cu_seqlens_q; // [num_seqs + 1]
  // [t] or null: each row's key end for bidirectional spans (PagedAttentionArgs::key_ends).
  const int32_t* key_ends = nullptr;
  int num_seqs;
  // Per KV cache group (vLLM's: full-attention and sliding-window layers keep
  // separate block tables): slot_mapping [t] (negative = padding, not cached),
  // block_tables [num_seqs, max_blocks_per_seq[g]]; layer_groups[layer] = g.
  std::vector<const int32_t*> slot_mappings;
  std::vector<const int32_t*> block_tables;
  std::vector<int> max_blocks_per_seq;
  std::vector<int> layer_groups;
  StackNorm final_norm;
  // The model's layers (held by its DecoderStackWeights, not copied per step)
  // and each layer's caches [num_blocks, block_size, num_kv_heads, head_dim]
  // of kv_type.
  const std::vector<StackLayer>* layers;
  std::vector<void*> key_caches;
  std::vector<void*> value_caches;
  // The resident adapters' sites, ordered by (layer, projection), and each row's
  // slot (-1: the base model); both null without adapters in the step.
  const std::vector<StackLora>* lora = nullptr;
  const int32_t* lora_rows = nullptr;  // [t]
  // A segment: from `begin` to `end` (end.layer -1: through the final norm). Begun at o or down, carry_in is that projection's whole input
  // [t, in_features] (every rank's slice, gathered); ended at one, carry_out gets
  // this rank's slice of it ([t, num_heads * head_dim] attention output or
  // [t, gate width] gated columns) and `out` the residual stream as it stands.
  StackPoint begin{0, kLayerStart};
  StackPoint end{-1, kLayerStart};  // -1: the last layer's end
  const float* carry_in = nullptr;
  float* carry_out = nullptr;
};

// Runs every layer (of the segment); returns the attention route of the last one (diagnostics).
// Throws std::invalid_argument / std::out_of_range on inconsistent metadata
// (slots, block ids) before the first cache write of the offending layer.
dispatch::PagedDispatch decoder_stack_cpu(const StackArgs& a);

} // namespace vllm_metal::cpu
