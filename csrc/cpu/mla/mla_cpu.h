// Multi-head latent attention (DeepSeek-V2/V3, Kimi, MiniCPM3, GLM-4 MLA) over
// a paged latent cache, weight-absorbed: every query head attends over the
// one compressed row per token the cache holds.
//
// A token's cache row is [c (rank), k_pe (rope_dim)]: the normalised latent
// and its rotated positional key (vLLM's MLA cache layout, head size rank +
// rope_dim, one "KV head"). A query row of head h is [q_c (rank), q_pe
// (rope_dim)], q_c the head's no-position query already multiplied into the
// latent space (W_UK absorbed). Then
//   score(h, s) = scale * (q_c[h] . c[s] + q_pe[h] . k_pe[s])
//   out[h]      = sum_s softmax_s(score) c[s]              (rank wide; W_UV after)
// causal within each sequence: query row i of a sequence of q_len rows and
// seq_len cached tokens sits at position seq_len - q_len + i.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

struct MlaAttentionArgs {
  const void* q_latent;        // [T, H, rank]
  const void* q_pe;            // [T, H, rope_dim]
  Elem q_type;
  const void* cache;           // [num_blocks, block_size, rank + rope_dim]
  Elem cache_type;
  const int32_t* block_tables; // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq;
  const int32_t* seq_lens;     // [num_seqs]
  const int32_t* cu_seqlens_q; // [num_seqs + 1]
  int num_seqs;
  int total_q;
  int num_heads;
  int rank;
  int rope_dim;
  int block_size;
  int num_blocks;
  float scale;
  void* out;                   // [T, H, rank]
  Elem out_type;
};

// Throws std::invalid_argument / std::out_of_range for inconsistent metadata
// (a block id outside the cache, a sequence shorter than its query rows)
// before anything is written.
void mla_attention_cpu(const MlaAttentionArgs& a);

struct LatentWriteArgs {
  const void* latent;          // [T, rank]
  const void* k_pe;            // [T, rope_dim]
  Elem src_type;
  const int32_t* slots;        // [T]: block * block_size + offset; negative: skipped
  int64_t t;
  int rank;
  int rope_dim;
  void* cache;                 // [num_slots, rank + rope_dim]
  Elem cache_type;
  int64_t num_slots;
};

// cache[slot[t]] = [latent[t], k_pe[t]] rounded to the cache's type. Throws
// std::out_of_range for a slot past the cache before writing anything.
void latent_cache_write_cpu(const LatentWriteArgs& a);

} // namespace vllm_metal::cpu
