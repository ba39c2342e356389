// Merge of split-KV partials: the final output of each (query row, head).
//
// Grid: (num_heads, total_q, 1) threadgroups of one simdgroup. Lanes scan the
// partitions' (max, exp-sum) pairs for the global max and the rescaled total,
// then every lane sums its head elements (l, l + 32, ...) over the partitions,
// each weighted by exp-sum * 2^(max - global max). Empty partitions (exp-sum 0)
// add nothing; sinks join the denominator here.
//
// Buffers: 6 sinks float [num_heads]; 7 out [total_q, num_heads, D];
// 8 partial_stats float [total_q, num_heads, num_partitions, 2];
// 9 partial_out float [total_q, num_heads, num_partitions, D]; 10 params.
#pragma once

#include "attention_utils.h"

template <typename T, int HEAD_SIZE>
[[kernel]] void paged_attention_v2_reduce(
    device const float* sinks [[buffer(6)]],
    device T* out [[buffer(7)]],
    device const float* partial_stats [[buffer(8)]],
    device const float* partial_out [[buffer(9)]],
    constant PagedAttentionParams& params [[buffer(10)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr int ELEMS = (HEAD_SIZE + 31) / 32;
  const int head = int(group.x);
  const long row_head = long(group.y) * params.num_heads + head;
  const int num_partitions = params.num_partitions;
  device const float* stats = partial_stats + row_head * num_partitions * 2;
  device const float* parts = partial_out + row_head * num_partitions * HEAD_SIZE;

  float m = kEmptyMax;
  for (int p = int(lane); p < num_partitions; p += 32) m = max(m, stats[2 * p]);
  m = simd_max(m);
  float l = 0.0f;
  for (int p = int(lane); p < num_partitions; p += 32) l += stats[2 * p + 1] * exp2(stats[2 * p] - m);
  l = simd_sum(l);

  float acc[ELEMS];
  for (int i = 0; i < ELEMS; ++i) acc[i] = 0.0f;
  for (int p = 0; p < num_partitions; ++p) {
    const float w = stats[2 * p + 1] * exp2(stats[2 * p] - m);
    if (w == 0.0f) continue;  // empty partition: its output slots hold zeros anyway
    for (int i = 0; i < ELEMS; ++i) {
      const int d = int(lane) + 32 * i;
      if (d < HEAD_SIZE) acc[i] += w * parts[long(p) * HEAD_SIZE + d];
    }
  }
  const float factor = output_factor(m, l, head, sinks);
  for (int i = 0; i < ELEMS; ++i) {
    const int d = int(lane) + 32 * i;
    if (d < HEAD_SIZE) out[row_head * HEAD_SIZE + d] = T(acc[i] * factor);
  }
}
