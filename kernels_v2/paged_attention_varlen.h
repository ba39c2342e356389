// Unified paged varlen attention: prefill, chunked prefill and decode rows of
// many sequences in one launch (vLLM's unified-attention idea).
//
// Grid: (num_heads, total_q, num_partitions) threadgroups of kVarlenSimdgroups
// simdgroups. Each threadgroup finds its row's sequence by binary search over
// cu_seqlens_q, then attends causally to the row's keys (its window with
// use_sliding_window; one partition of them with write_partials). Simdgroups
// take whole pages in turn; lanes split the head dimension (lane l holds
// elements l, l + 32, ...), so any head size up to 256 works. The simdgroups'
// softmax states merge through threadgroup memory.
//
// Buffers: 0 query [total_q, num_heads, D]; 1/2 key/value cache
// [num_blocks, BLOCK_SIZE, num_kv_heads, D] (with kv_quant: bytes [...,
// D + 4], codes and each head row's scale, kv_quant.h); 3 block_tables int
// [num_seqs, max_blocks_per_seq]; 4 seq_lens int [num_seqs]; 5 cu_seqlens_q
// int [num_seqs + 1]; 6 sinks float [num_heads]; 7 out [total_q, num_heads, D];
// 8 partial_stats float [total_q, num_heads, num_partitions, 2] (max, exp-sum,
// log2 domain); 9 partial_out float [total_q, num_heads, num_partitions, D]
// (normalized); 10 PagedAttentionParams; 11 key_ends int [total_q] (read with
// params.use_key_ends: a row of a bidirectional span also attends to the keys
// after it, up to its entry, capped at the sequence's length).
#pragma once

#include "attention_utils.h"

constant constexpr int kVarlenSimdgroups = 4;

template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
[[kernel]] void paged_attention_varlen(
    device const T* query [[buffer(0)]],
    device const T* key_cache [[buffer(1)]],
    device const T* value_cache [[buffer(2)]],
    device const int* block_tables [[buffer(3)]],
    device const int* seq_lens [[buffer(4)]],
    device const int* cu_seqlens_q [[buffer(5)]],
    device const float* sinks [[buffer(6)]],
    device T* out [[buffer(7)]],
    device float* partial_stats [[buffer(8)]],
    device float* partial_out [[buffer(9)]],
    constant PagedAttentionParams& params [[buffer(10)]],
    device const int* key_ends [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]],
    uint simd_id [[simdgroup_index_in_threadgroup]],
    uint thread_id [[thread_index_in_threadgroup]]) {
  constexpr int ELEMS = (HEAD_SIZE + 31) / 32;
  const int head = int(group.x);
  const int row = int(group.y);
  const int part = int(group.z);
  const int seq = find_sequence(cu_seqlens_q, params.num_seqs, row);
  const int q_start = cu_seqlens_q[seq];
  const int q_len = cu_seqlens_q[seq + 1] - q_start;
  const int pos = seq_lens[seq] - q_len + (row - q_start);
  int key_begin = use_sliding_window ? max(0, pos - params.sliding_window + 1) : 0;
  int key_end = pos + 1;
  if (params.use_key_ends) key_end = max(key_end, min(key_ends[row], seq_lens[seq]));
  if (write_partials) {
    key_begin = max(key_begin, part * params.partition_size);
    key_end = min(key_end, (part + 1) * params.partition_size);
  }
  const int kv_head = head / (params.num_heads / params.num_kv_heads);
  const int row_width = kv_row_width(HEAD_SIZE);                  // one head of one token
  const long row_stride = long(params.num_kv_heads) * row_width;  // one token of one page
  const int value_width = kv_value_row_width(HEAD_SIZE);           // the same for values
  const long value_stride = long(params.num_kv_heads) * value_width;

  float q[ELEMS];
  float acc[ELEMS];
  const float q_scale = query_scale(params);
  device const T* q_row = query + (long(row) * params.num_heads + head) * HEAD_SIZE;
  for (int i = 0; i < ELEMS; ++i) {
    const int d = int(lane) + 32 * i;
    q[i] = d < HEAD_SIZE ? float(q_row[d]) * q_scale : 0.0f;
    acc[i] = 0.0f;
  }
  if (kv_quant == 4) {  // Rot4 keys are rotated: the query is too (HEAD_SIZE = 32 ELEMS)
    hadamard_simd<ELEMS>(q, lane);
    for (int i = 0; i < ELEMS; ++i) q[i] *= rsqrt(float(HEAD_SIZE));
  }
  float m = kEmptyMax;
  float l = 0.0f;

  device const int* table = block_tables + long(seq) * params.max_blocks_per_seq;
  const int first_block = key_begin / BLOCK_SIZE;
  const int last_block = key_end > key_begin ? (key_end - 1) / BLOCK_SIZE : first_block - 1;
  for (int b = first_block + int(simd_id); b <= last_block; b += kVarlenSimdgroups) {
    const int t0 = max(key_begin, b * BLOCK_SIZE);
    const int t1 = min(key_end, (b + 1) * BLOCK_SIZE);
    const long page = long(table[b]) * BLOCK_SIZE * row_stride + long(kv_head) * row_width;
    const long value_page = long(table[b]) * BLOCK_SIZE * value_stride + long(kv_head) * value_width;
    for (int t = t0; t < t1; ++t) {
      const long offset = page + long(t - b * BLOCK_SIZE) * row_stride;
      const long value_offset = value_page + long(t - b * BLOCK_SIZE) * value_stride;
      float partial = 0.0f;
      for (int i = 0; i < ELEMS; ++i) {
        const int d = int(lane) + 32 * i;
        if (d < HEAD_SIZE) partial += q[i] * kv_key_element(key_cache, offset, d);
      }
      const float s = finish_score(simd_sum(partial) * kv_key_scale(key_cache, offset, HEAD_SIZE), params);
      const float m_new = max(m, s);
      const float carry = exp2(m - m_new);
      const float p = exp2(s - m_new);
      l = l * carry + p;
      const float pv = p * kv_value_scale(value_cache, value_offset, HEAD_SIZE);
      const float pb = kv_nibble_values() ? p * kv_value_bias(value_cache, value_offset, HEAD_SIZE) : 0.0f;
      for (int i = 0; i < ELEMS; ++i) {
        const int d = int(lane) + 32 * i;
        acc[i] = acc[i] * carry + (d < HEAD_SIZE ? pv * kv_value_element(value_cache, value_offset, d) + pb : 0.0f);
      }
      m = m_new;
    }
  }

  // Merge the simdgroups' states: max, then rescaled sums.
  threadgroup float sg_max[kVarlenSimdgroups];
  threadgroup float sg_sum[kVarlenSimdgroups];
  threadgroup float sg_acc[kVarlenSimdgroups * HEAD_SIZE];
  if (lane == 0) {
    sg_max[simd_id] = m;
    sg_sum[simd_id] = l;
  }
  for (int i = 0; i < ELEMS; ++i) {
    const int d = int(lane) + 32 * i;
    if (d < HEAD_SIZE) sg_acc[simd_id * HEAD_SIZE + d] = acc[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float m_all = sg_max[0];
  for (int s = 1; s < kVarlenSimdgroups; ++s) m_all = max(m_all, sg_max[s]);
  float weight[kVarlenSimdgroups];
  float l_all = 0.0f;
  for (int s = 0; s < kVarlenSimdgroups; ++s) {
    weight[s] = exp2(sg_max[s] - m_all);
    l_all += sg_sum[s] * weight[s];
  }
  const long slot = (long(row) * params.num_heads + head) * params.num_partitions + part;
  const float factor = write_partials ? (l_all > 0.0f ? 1.0f / l_all : 0.0f)
                                      : output_factor(m_all, l_all, head, sinks);
  for (int d = int(thread_id); d < HEAD_SIZE; d += kVarlenSimdgroups * 32) {
    float o = 0.0f;
    for (int s = 0; s < kVarlenSimdgroups; ++s) o += sg_acc[s * HEAD_SIZE + d] * weight[s];
    if (write_partials) {
      partial_out[slot * HEAD_SIZE + d] = o * factor;
    } else {
      out[(long(row) * params.num_heads + head) * HEAD_SIZE + d] = T(o * factor);
    }
  }
  if (write_partials && thread_id == 0) {
    partial_stats[2 * slot] = m_all;
    partial_stats[2 * slot + 1] = l_all;
  }
}
