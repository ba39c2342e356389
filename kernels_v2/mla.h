// Multi-head latent attention over a paged latent cache (csrc/cpu/mla/mla_cpu.h
// has the maths; the CPU kernels compute the same).
//
// latent_cache_write, grid (ceil((rank + rope_dim) / 128), T) of 128 threads: one
// element of token t's cache row [latent, k_pe] each; a negative slot or one past
// the cache is skipped (a kernel cannot raise; the host and the CPU op check).
//
// mla_attention, grid (H, T) threadgroups of one simdgroup: query row t, head h.
// Its sequence is found in cu_seqlens_q; it attends the keys up to its position
// (causal). Lane l holds query columns l, l + 32, ... of [q_latent, q_pe] (scaled
// by scale * log2(e)) and accumulator columns l, l + 32, ... of the output; per key
// the lanes' partial dot products meet in simd_sum, the online softmax (log2 space)
// is uniform over the simdgroup, and each lane adds p times its latent columns.
// Each output is one fixed sequence of operations, whatever else is in the batch.
// A block id outside the cache gives NaN rows (the CPU op raises).
//
// Buffers (attention): 0 q_latent [T, H, rank]; 1 q_pe [T, H, rope_dim];
// 2 cache [num_blocks, block_size, rank + rope_dim]; 3 block_tables int [S, B];
// 4 seq_lens int [S]; 5 cu_seqlens_q int [S + 1]; 6 out [T, H, rank]; 7 MlaParams.
// Buffers (cache write): 0 latent [T, rank]; 1 k_pe [T, rope_dim]; 2 cache;
// 3 slot_mapping int [T]; 7 MlaParams.
#pragma once

#include <metal_stdlib>

#include "mla_params.h"

using namespace metal;

constant constexpr int kMlaRankPerLane = 16;  // rank up to 512 (DeepSeek-V2/V3, Kimi)
constant constexpr int kMlaRopePerLane = 4;   // rope_dim up to 128
constant constexpr int kMlaWriteThreads = 128;
constant constexpr float kMlaLog2e = 1.4426950408889634f;

template <typename T>
[[kernel]] void latent_cache_write(
    device const T* latent [[buffer(0)]],
    device const T* k_pe [[buffer(1)]],
    device T* cache [[buffer(2)]],
    device const int* slots [[buffer(3)]],
    constant MlaParams& params [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]]) {
  const int width = params.rank + params.rope_dim;
  const int c = int(group.x) * kMlaWriteThreads + int(thread_id);
  const int t = int(group.y);
  if (c >= width) return;
  const long slot = slots[t];
  if (slot < 0 || slot >= long(params.num_blocks) * params.block_size) return;
  cache[slot * width + c] =
      c < params.rank ? latent[long(t) * params.rank + c] : k_pe[long(t) * params.rope_dim + c - params.rank];
}

template <typename T>
[[kernel]] void mla_attention(
    device const T* q_latent [[buffer(0)]],
    device const T* q_pe [[buffer(1)]],
    device const T* cache [[buffer(2)]],
    device const int* block_tables [[buffer(3)]],
    device const int* seq_lens [[buffer(4)]],
    device const int* cu_seqlens_q [[buffer(5)]],
    device T* out [[buffer(6)]],
    constant MlaParams& params [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  const int h = int(group.x);
  const int t = int(group.y);
  int seq = 0;
  while (seq + 1 < params.num_seqs && cu_seqlens_q[seq + 1] <= t) ++seq;
  const int q_len = cu_seqlens_q[seq + 1] - cu_seqlens_q[seq];
  const int pos = seq_lens[seq] - q_len + (t - cu_seqlens_q[seq]);
  const int rank = params.rank, rope = params.rope_dim, width = rank + rope;
  const int rank_lanes = rank / 32;
  const float mul = params.scale * kMlaLog2e;
  float ql[kMlaRankPerLane];
  float qp[kMlaRopePerLane];
  float acc[kMlaRankPerLane];
  device const T* qr = q_latent + (long(t) * params.num_heads + h) * rank;
  device const T* pr = q_pe + (long(t) * params.num_heads + h) * rope;
  for (int i = 0; i < kMlaRankPerLane; ++i) {
    ql[i] = i < rank_lanes ? float(qr[int(lane) + 32 * i]) * mul : 0.0f;
    acc[i] = 0.0f;
  }
  for (int i = 0; i < kMlaRopePerLane; ++i) {
    const int c = int(lane) + 32 * i;
    qp[i] = c < rope ? float(pr[c]) * mul : 0.0f;
  }
  float m = -1e30f;  // finite: exp2(m_old - m_new) stays exact under fast math
  float l = 0.0f;
  device const int* table = block_tables + long(seq) * params.max_blocks_per_seq;
  for (int key = 0; key <= pos; ++key) {
    const int block = table[key / params.block_size];
    const bool valid = block >= 0 && block < params.num_blocks;  // uniform over the simdgroup
    device const T* row = cache + (long(valid ? block : 0) * params.block_size + key % params.block_size) * width;
    float part = 0.0f;
    for (int i = 0; i < rank_lanes; ++i) part = fma(ql[i], float(row[int(lane) + 32 * i]), part);
    for (int i = 0; i < kMlaRopePerLane; ++i) {
      const int c = int(lane) + 32 * i;
      if (c < rope) part = fma(qp[i], float(row[rank + c]), part);
    }
    const float score = valid ? simd_sum(part) : NAN;
    const float m_new = max(m, score);
    const float correction = exp2(m - m_new);
    const float p = exp2(score - m_new);
    l = l * correction + p;
    m = m_new;
    for (int i = 0; i < rank_lanes; ++i) acc[i] = fma(p, float(row[int(lane) + 32 * i]), acc[i] * correction);
  }
  device T* o = out + (long(t) * params.num_heads + h) * rank;
  for (int i = 0; i < rank_lanes; ++i) o[int(lane) + 32 * i] = T(acc[i] / l);
}
