// CPU paged attention over a varlen batch (the body of PagedAttention::eval_cpu).
#pragma once

#include <cstdint>
#include <optional>

#include "dispatch/paged_dispatch.h"
#include "kv_quant.h"
#include "mlx/dtype.h"

namespace vllm_metal::cpu {

// Raw views of the primitive's (row-contiguous) inputs and output.
struct PagedAttentionArgs {
  const void* query; // [total_q, num_heads, head_size]
  mlx::core::Dtype query_dtype = mlx::core::float32; // also the output dtype
  const void* key_cache; // [num_blocks, block_size, num_kv_heads, head_size]
  const void* value_cache; // same shape and dtype as key_cache
  // Float caches at head sizes 64 / 128 / 256 only: key_cache is
  // [num_blocks, num_kv_heads, head_size, block_size] (read by the pieces kernel).
  bool key_columns = false;
  mlx::core::Dtype kv_dtype = mlx::core::float32; // uint8 when quantized
  KvQuant kv_quant = KvQuant::None; // quantized: rows of head_size + kKvScaleBytes bytes
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
  // [total_q] or nullptr: row r attends to keys before key_ends[r] when that is
  // past its own position (bidirectional image spans), capped at its context.
  const int32_t* key_ends = nullptr;
};

// One past the last key of query row `token` at position `pos` of a sequence
// of `seq_len` keys: pos + 1 (causal), or its key_ends entry where that is later.
inline int row_key_end(const PagedAttentionArgs& p, int token, int pos, int seq_len) {
  const int causal = pos + 1;
  if (p.key_ends == nullptr) return causal;
  const int end = p.key_ends[token] < seq_len ? p.key_ends[token] : seq_len;
  return end > causal ? end : causal;
}

// One past the last key any of query rows [r0, r1) of sequence `seq` attends to.
inline int chunk_key_end(const PagedAttentionArgs& p, int seq, int r0, int r1) {
  const int q_start = p.cu_seqlens_q[seq];
  const int pos0 = p.seq_lens[seq] - (p.cu_seqlens_q[seq + 1] - q_start);
  int end = pos0 + r1; // causal: the last row attends up to itself
  if (p.key_ends == nullptr) return end;
  for (int r = r0; r < r1; ++r) {
    const int row_end = row_key_end(p, q_start + r, pos0 + r, p.seq_lens[seq]);
    if (row_end > end) end = row_end;
  }
  return end;
}

// Throws std::invalid_argument naming the problem if cu_seqlens_q / seq_lens
// are inconsistent with each other or with block_tables
// (dispatch::check_paged_metadata, which the Metal route runs too).
void check_paged_metadata(const PagedAttentionArgs& args);

// The dispatch inputs of this call (reads seq_lens and cu_seqlens_q).
dispatch::PagedProblem describe_problem(const PagedAttentionArgs& args);

// Decides the route (dispatch::decide_cpu_paged_dispatch with the pool's
// thread count, or the forced route) and runs it on the calling thread plus
// the extension's thread pool; decode rows run the single-row kernel. Throws std::invalid_argument /
// std::out_of_range on inconsistent metadata (checked before any output is
// written) or a block id outside the cache. Returns the route taken.
dispatch::PagedDispatch paged_attention_cpu(const PagedAttentionArgs& args);

// The two halves of paged_attention_cpu, for callers that run several calls
// over the same metadata (the decoder stack's layers): plan checks the
// metadata and decides the route; run executes a decided route.
dispatch::PagedDispatch plan_paged_attention_cpu(const PagedAttentionArgs& args);
void run_paged_attention_cpu(const PagedAttentionArgs& args, const dispatch::PagedDispatch& d);

// Tests and benchmarks: make the CPU backend take `route` (with partitions of
// at most `partition_size` keys for SplitKv / GqaDecode) instead of deciding;
// nullopt restores the decision.
void force_cpu_route(std::optional<dispatch::PagedRoute> route, int partition_size);

} // namespace vllm_metal::cpu
