// GQA decode: one query token per sequence, the query heads of a GQA group
// sharing every K/V read of their KV head.
//
// Grid: (num_kv_heads, num_seqs, num_partitions) threadgroups; a threadgroup
// holds one simdgroup per query head of the group (NUM_HEADS / NUM_KV_HEADS),
// so the group's heads read the same K/V lines at the same time. Lanes split
// the head dimension into contiguous runs of HEAD_SIZE / 32 elements (vector
// loads). Softmax is online in log2 space (log2(e) folded into the query scale:
// one exp2 per score). Lane 0 fetches the next page's block id while the page
// is processed and simd_shuffle hands it to the other lanes. Inside a page, 4
// tokens per step: four independent dot products reduced by one simd_sum of a
// float4, merged in one online-softmax update; 1-3 leftover tokens go one by
// one. No threadgroup memory, no barriers.
//
// With write_partials, partition z covers keys [z * partition_size,
// (z + 1) * partition_size) and writes (max, exp-sum) and its normalized
// output to the scratch buffers for paged_attention_v2_reduce; otherwise the
// one partition writes the output.
//
// Buffers: as paged_attention_varlen (0 query [num_seqs, NUM_HEADS, D], 1/2
// caches, float or quantized by kv_quant, 3 block_tables, 4 seq_lens, 6 sinks,
// 7 out, 8/9 partials, 10 params);
// query row = sequence (every sequence has exactly one query token).
#pragma once

#include "attention_utils.h"

template <typename T, int NUM_HEADS, int NUM_KV_HEADS, int HEAD_SIZE, int BLOCK_SIZE>
[[kernel]] void paged_attention_gqa_decode(
    device const T* query [[buffer(0)]],
    device const T* key_cache [[buffer(1)]],
    device const T* value_cache [[buffer(2)]],
    device const int* block_tables [[buffer(3)]],
    device const int* seq_lens [[buffer(4)]],
    device const float* sinks [[buffer(6)]],
    device T* out [[buffer(7)]],
    device float* partial_stats [[buffer(8)]],
    device float* partial_out [[buffer(9)]],
    constant PagedAttentionParams& params [[buffer(10)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]],
    uint simd_id [[simdgroup_index_in_threadgroup]]) {
  constexpr int GROUP = NUM_HEADS / NUM_KV_HEADS;
  constexpr int ELEMS = HEAD_SIZE / 32;
  static_assert(NUM_HEADS % NUM_KV_HEADS == 0, "query heads must be a multiple of KV heads");
  static_assert(HEAD_SIZE % 128 == 0, "lanes hold whole float4 runs of the head");
  static_assert(VLLM_METAL_SMALL_PARTITION_SIZE % BLOCK_SIZE == 0, "partitions must hold whole pages");
  static_assert(BLOCK_SIZE % 4 == 0, "full pages step 4 tokens at a time");

  const int kv_head = int(group.x);
  const int seq = int(group.y);
  const int part = int(group.z);
  const int head = kv_head * GROUP + int(simd_id);
  const int context = seq_lens[seq];
  int key_begin = use_sliding_window ? max(0, context - params.sliding_window) : 0;
  int key_end = context;
  if (write_partials) {
    key_begin = max(key_begin, part * params.partition_size);
    key_end = min(key_end, (part + 1) * params.partition_size);
  }

  float q[ELEMS];
  float acc[ELEMS];
  load_floats<T, ELEMS>(query + (long(seq) * NUM_HEADS + head) * HEAD_SIZE + lane * ELEMS, q);
  const float q_scale = query_scale(params);
  for (int i = 0; i < ELEMS; ++i) {
    q[i] *= q_scale;
    acc[i] = 0.0f;
  }
  if (kv_quant == 4) {  // Rot4 keys are rotated: the query is too (HEAD_SIZE = 32 ELEMS)
    hadamard_simd<ELEMS>(q, lane);
    for (int i = 0; i < ELEMS; ++i) q[i] *= rsqrt(float(HEAD_SIZE));
  }
  float m = kEmptyMax;
  float l = 0.0f;
  const int row_width = kv_row_width(HEAD_SIZE);                 // one head of one token
  const long token_stride = long(NUM_KV_HEADS) * row_width;      // next token of a page
  const int value_width = kv_value_row_width(HEAD_SIZE);          // the same for values
  const long value_stride = long(NUM_KV_HEADS) * value_width;

  if (key_begin < key_end) {
    device const int* table = block_tables + long(seq) * params.max_blocks_per_seq;
    const int first_block = key_begin / BLOCK_SIZE;
    const int last_block = (key_end - 1) / BLOCK_SIZE;
    int next_block = lane == 0 ? table[first_block] : 0;
    for (int b = first_block; b <= last_block; ++b) {
      const int block = simd_shuffle(next_block, 0);
      if (lane == 0 && b < last_block) next_block = table[b + 1];  // in flight during this page
      // The page's head rows start here; a lane reads its run at + lane * ELEMS.
      const long page = (long(block) * BLOCK_SIZE * NUM_KV_HEADS + kv_head) * row_width;
      const long value_page = (long(block) * BLOCK_SIZE * NUM_KV_HEADS + kv_head) * value_width;
      const long run = lane * ELEMS;
      const int t_end = min(key_end - b * BLOCK_SIZE, BLOCK_SIZE);
      int t = max(key_begin - b * BLOCK_SIZE, 0);
      for (; t + 4 <= t_end; t += 4) {
        float4 dots = 0.0f;
        float4 k_scale, v_scale, v_bias;
        for (int j = 0; j < 4; ++j) {
          const long row = page + (t + j) * token_stride;
          float k[ELEMS];
          load_key<T, ELEMS>(key_cache, row, run, k);
          float d = 0.0f;
          for (int i = 0; i < ELEMS; ++i) d += q[i] * k[i];
          dots[j] = d;
          k_scale[j] = kv_key_scale(key_cache, row, HEAD_SIZE);
          const long value_row = value_page + (t + j) * value_stride;
          v_scale[j] = kv_value_scale(value_cache, value_row, HEAD_SIZE);
          v_bias[j] = kv_value_bias(value_cache, value_row, HEAD_SIZE);
        }
        const float4 s = finish_scores(simd_sum(dots) * k_scale, params);
        const float m_new = max(m, max(max(s.x, s.y), max(s.z, s.w)));
        const float carry = exp2(m - m_new);
        const float4 p = exp2(s - m_new);
        l = l * carry + ((p.x + p.y) + (p.z + p.w));
        const float4 pv = p * v_scale;
        const float4 pb = kv_nibble_values() ? p * v_bias : float4(0.0f);
        for (int i = 0; i < ELEMS; ++i) acc[i] *= carry;
        for (int j = 0; j < 4; ++j) {
          float v[ELEMS];
          load_value<T, ELEMS>(value_cache, value_page + (t + j) * value_stride, run, v);
          if (kv_nibble_values()) {
            for (int i = 0; i < ELEMS; ++i) acc[i] += pv[j] * v[i] + pb[j];
          } else {
            for (int i = 0; i < ELEMS; ++i) acc[i] += pv[j] * v[i];
          }
        }
        m = m_new;
      }
      for (; t < t_end; ++t) {
        const long row = page + t * token_stride;
        const long value_row = value_page + t * value_stride;
        float k[ELEMS];
        float v[ELEMS];
        load_key<T, ELEMS>(key_cache, row, run, k);
        float d = 0.0f;
        for (int i = 0; i < ELEMS; ++i) d += q[i] * k[i];
        const float s = finish_score(simd_sum(d) * kv_key_scale(key_cache, row, HEAD_SIZE), params);
        const float m_new = max(m, s);
        const float carry = exp2(m - m_new);
        const float p = exp2(s - m_new);
        l = l * carry + p;
        const float pv = p * kv_value_scale(value_cache, value_row, HEAD_SIZE);
        const float pb = kv_nibble_values() ? p * kv_value_bias(value_cache, value_row, HEAD_SIZE) : 0.0f;
        load_value<T, ELEMS>(value_cache, value_row, run, v);
        for (int i = 0; i < ELEMS; ++i) acc[i] = acc[i] * carry + pv * v[i] + pb;
        m = m_new;
      }
    }
  }

  if (write_partials) {
    const long slot = (long(seq) * NUM_HEADS + head) * params.num_partitions + part;
    store_floats<float, ELEMS>(acc, l > 0.0f ? 1.0f / l : 0.0f, partial_out + slot * HEAD_SIZE + lane * ELEMS);
    if (lane == 0) {
      partial_stats[2 * slot] = m;
      partial_stats[2 * slot + 1] = l;
    }
  } else {
    store_floats<T, ELEMS>(acc, output_factor(m, l, head, sinks),
                           out + (long(seq) * NUM_HEADS + head) * HEAD_SIZE + lane * ELEMS);
  }
}
