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
};

struct StackNorm {
  const void* w; // [d]
  Elem type;
  float eps;
};

// x -> x + attn(input_norm(x)); x -> x + mlp(post_norm(x)), with
// mlp(y) = down(silu(gate(y)) * up(y)) and attention on paged caches (fp32,
// or fp16/bf16: keys and values are rounded once, when written).
struct StackLayer {
  StackNorm input_norm;
  StackLinear q, k, v, o;
  bool qk_norm = false;
  StackNorm q_norm{}, k_norm{}; // per head, over head_dim
  StackNorm post_norm;
  StackLinear gate, up, down;
  // RoPE (see RopeArgs): inv_freq from base or freqs (float32 [dims / 2]).
  int rope_dims;
  bool rope_traditional;
  double rope_base;
  const float* rope_freqs; // nullptr: base
  double rope_scale;
  float attn_scale;
  int sliding_window; // 0: full context
  float softcap;      // 0: off
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
  Elem kv_type = Elem::F32;    // of every layer's caches
  const int32_t* positions;    // [t]
  const int32_t* slot_mapping; // [t]; negative = padding, not cached
  const int32_t* block_tables; // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens;     // [num_seqs]
  const int32_t* cu_seqlens_q; // [num_seqs + 1]
  int num_seqs;
  int max_blocks_per_seq;
  StackNorm final_norm;
  // The model's layers (held by its DecoderStackWeights, not copied per step)
  // and each layer's caches [num_blocks, block_size, num_kv_heads, head_dim]
  // of kv_type.
  const std::vector<StackLayer>* layers;
  std::vector<void*> key_caches;
  std::vector<void*> value_caches;
};

// Runs every layer; returns the attention route of the last one (diagnostics).
// Throws std::invalid_argument / std::out_of_range on inconsistent metadata
// (slots, block ids) before the first cache write of the offending layer.
dispatch::PagedDispatch decoder_stack_cpu(const StackArgs& a);

} // namespace vllm_metal::cpu
