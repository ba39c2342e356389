// CPU paged attention over a varlen batch (the body of PagedAttention::eval_cpu).
#pragma once

#include <cstdint>

#include "mlx/dtype.h"

namespace vllm_metal::cpu {

// Raw views of the primitive's (row-contiguous) inputs and output.
struct PagedAttentionArgs {
  const void* query; // [total_q, num_heads, head_size]
  mlx::core::Dtype query_dtype = mlx::core::float32; // also the output dtype
  const void* key_cache; // [num_blocks, block_size, num_kv_heads, head_size]
  const void* value_cache; // same shape and dtype as key_cache
  mlx::core::Dtype kv_dtype = mlx::core::float32;
  const int32_t* block_tables; // [num_seqs, max_blocks_per_seq]
  const int32_t* seq_lens; // [num_seqs], context length incl. this step
  const int32_t* cu_seqlens_q; // [num_seqs + 1]
  const float* sinks; // [num_heads] or nullptr
  void* out; // [total_q, num_heads, head_size]
  int total_q;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int num_blocks;
  int block_size;
  int num_seqs;
  int max_blocks_per_seq;
  float scale;
  int sliding_window; // 0 = full causal context
  float softcap; // 0 = off
};

// Runs on the calling thread plus the extension's thread pool. Throws
// std::invalid_argument / std::out_of_range on inconsistent metadata (checked
// before any output is written) or a block id outside the cache.
void paged_attention_cpu(const PagedAttentionArgs& args);

} // namespace vllm_metal::cpu
