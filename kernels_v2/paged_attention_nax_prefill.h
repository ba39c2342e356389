// Paged prefill on the GPU's tensor units (Apple's "neural accelerators", M5 and
// later): Q K^T and P V as MetalPerformancePrimitives matmul2d ops, the online
// softmax between them in plain MSL. The same inputs, outputs and masks as the
// varlen kernel (paged_attention_varlen.h), for prefill batches of float16 or
// bfloat16 with a float cache (no write_partials, no kv_quant: the dispatch
// takes this route only then).
//
// Grid: (num_heads, tiles, 1) threadgroups of kNaxSimdgroups simdgroups. A tile
// is kNaxTileRows query rows of one sequence (a sequence of q rows has
// ceil(q / kNaxTileRows) tiles, numbered sequence after sequence); simdgroup g
// owns its rows [16 g, 16 g + 16). Keys go by blocks of kNaxKeys: the threadgroup
// copies a block's keys from their pages into threadgroup memory, each simdgroup
// computes its 16 x 32 scores (matmul2d 16 x 32, k = 32 per head-dim chunk),
// stores them to threadgroup memory, runs the online softmax over its rows
// there (two lanes a row), then the block's values replace the keys and each
// simdgroup adds P V into its output, head_size / 32 tiles of 16 x 32 held as
// cooperative tensors (matmul2d 16 x 32, k = 32 keys).
//
// The cooperative tensors' layouts are implementation-defined: the kernel
// reaches their elements only through get_multidimensional_index.
//
// Query rows are read in place: a simdgroup's 16-row view of the query starts
// at its first row, or 16 rows before the end of the query when fewer remain
// (every view stays inside the buffer; rows of the view that are not the
// simdgroup's are computed and dropped). The dispatch asks for at least 16
// query rows in all.
//
// Buffers: those of paged_attention_varlen (0-7, 10, 11; 8 and 9 unused).
#pragma once

#if defined(__HAVE_TENSOR__)

#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

#include "attention_utils.h"

constant constexpr int kNaxSimdgroups = 4;
constant constexpr int kNaxRows = 16;  // query rows of a simdgroup (the ops' m)
constant constexpr int kNaxTileRows = kNaxSimdgroups * kNaxRows;
constant constexpr int kNaxKeys = 32;  // keys of a block (the scores' n, the P V op's k)
constant constexpr int kNaxChunk = 32;  // head-dim columns per op (the Q K^T op's k, P V's n)

// Keys (or values) kb .. kb + kNaxKeys - 1 of one KV head from their pages into
// dst [kNaxKeys, HEAD_SIZE], those at or past key_end as 0; all threads of the
// threadgroup take part.
template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
METAL_FUNC void nax_load_block(device const T* cache, threadgroup T* dst, device const int* table, int kb,
                               int key_end, long token_stride, int kv_head, int thread_id) {
  for (int e = thread_id; e < kNaxKeys * HEAD_SIZE; e += kNaxSimdgroups * 32) {
    const int j = e / HEAD_SIZE, d = e % HEAD_SIZE, t = kb + j;
    dst[e] = t < key_end
        ? cache[(long(table[t / BLOCK_SIZE]) * BLOCK_SIZE + t % BLOCK_SIZE) * token_stride +
                long(kv_head) * HEAD_SIZE + d]
        : T(0.0f);
  }
}

template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
[[kernel]] void paged_attention_nax_prefill(
    device const T* query [[buffer(0)]],
    device const T* key_cache [[buffer(1)]],
    device const T* value_cache [[buffer(2)]],
    device const int* block_tables [[buffer(3)]],
    device const int* seq_lens [[buffer(4)]],
    device const int* cu_seqlens_q [[buffer(5)]],
    device const float* sinks [[buffer(6)]],
    device T* out [[buffer(7)]],
    constant PagedAttentionParams& params [[buffer(10)]],
    device const int* key_ends [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]],
    uint simd_id [[simdgroup_index_in_threadgroup]],
    uint thread_id [[thread_index_in_threadgroup]]) {
  using namespace mpp::tensor_ops;
  static_assert(HEAD_SIZE % kNaxChunk == 0, "the tensor-op route takes head sizes that are multiples of 32");
  constexpr int CHUNKS = HEAD_SIZE / kNaxChunk;
  using Ext = dextents<int32_t, 2>;
  using QView = tensor<device const T, Ext, tensor_inline>;
  using KView = tensor<threadgroup T, Ext, tensor_inline>;
  using PView = tensor<threadgroup float, Ext, tensor_inline>;

  // This threadgroup's tile: sequence `seq`, its rows [row0, row0 + 64).
  const int head = int(group.x);
  int tile = int(group.y);
  int seq = 0;
  for (; seq < params.num_seqs; ++seq) {
    const int tiles = (cu_seqlens_q[seq + 1] - cu_seqlens_q[seq] + kNaxTileRows - 1) / kNaxTileRows;
    if (tile < tiles) break;
    tile -= tiles;
  }
  if (seq == params.num_seqs) return;  // a grid larger than the tiles (uniform per threadgroup)
  const int q_start = cu_seqlens_q[seq];
  const int q_end = cu_seqlens_q[seq + 1];
  const int total_q = cu_seqlens_q[params.num_seqs];
  const int seq_len = seq_lens[seq];
  const int first_pos = seq_len - (q_end - q_start);  // position of the sequence's first query row
  const int row0 = q_start + tile * kNaxTileRows;
  const int tile_end = min(row0 + kNaxTileRows, q_end);

  // Keys the tile attends: from the first row's window start to the furthest row end.
  int key_begin = use_sliding_window ? max(0, first_pos + (row0 - q_start) - params.sliding_window + 1) : 0;
  int key_end = first_pos + (tile_end - q_start);
  if (params.use_key_ends) {
    for (int r = row0; r < tile_end; ++r) key_end = max(key_end, min(key_ends[r], seq_len));
  }
  const int kv_head = head / (params.num_heads / params.num_kv_heads);
  const long token_stride = long(params.num_kv_heads) * HEAD_SIZE;
  device const int* table = block_tables + long(seq) * params.max_blocks_per_seq;

  // This simdgroup's rows, and its 16-row view of the query (see the header).
  const int my_first = row0 + int(simd_id) * kNaxRows;
  const int my_end = min(my_first + kNaxRows, tile_end);
  const int view_first = min(my_first, total_q - kNaxRows);
  const bool has_rows = my_first < my_end;

  threadgroup T kv[kNaxKeys * HEAD_SIZE];
  threadgroup float scores[kNaxSimdgroups * kNaxRows * kNaxKeys];
  threadgroup float carries[kNaxSimdgroups * kNaxRows];
  threadgroup float* my_scores = scores + simd_id * kNaxRows * kNaxKeys;
  threadgroup float* my_carries = carries + simd_id * kNaxRows;

  constexpr auto qk_desc = matmul2d_descriptor(kNaxRows, kNaxKeys, kNaxChunk, false, true, true,
                                               matmul2d_descriptor::mode::multiply_accumulate);
  constexpr auto pv_desc = matmul2d_descriptor(kNaxRows, kNaxChunk, kNaxKeys, false, false, true,
                                               matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<qk_desc, execution_simdgroup> qk;
  matmul2d<pv_desc, execution_simdgroup> pv;
  using OTile = decltype(pv.template get_destination_cooperative_tensor<PView, KView, float>());
  OTile o[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) {
    for (int i = 0; i < o[c].get_capacity(); ++i) o[c][i] = 0.0f;
  }

  // Softmax state of the row this lane works on (two lanes a row: columns
  // [16 h, 16 h + 16) of the block for h = lane % 2).
  const int soft_row = int(lane) / 2;
  const int soft_half = int(lane) % 2;
  const int q_row = view_first + soft_row;
  const bool row_mine = q_row >= my_first && q_row < my_end;
  const int row_pos = first_pos + (q_row - q_start);
  const int row_begin = use_sliding_window ? max(0, row_pos - params.sliding_window + 1) : 0;
  int row_end = row_pos + 1;
  if (params.use_key_ends && row_mine) row_end = max(row_end, min(key_ends[q_row], seq_len));
  const float q_scale = query_scale(params);
  float m = kEmptyMax;
  float l = 0.0f;

  for (int kb = key_begin / kNaxKeys * kNaxKeys; kb < key_end; kb += kNaxKeys) {
    nax_load_block<T, HEAD_SIZE, BLOCK_SIZE>(key_cache, kv, table, kb, key_end, token_stride, kv_head,
                                             int(thread_id));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (has_rows) {
      auto s = qk.template get_destination_cooperative_tensor<QView, KView, float>();
      for (int i = 0; i < s.get_capacity(); ++i) s[i] = 0.0f;
      for (int c = 0; c < CHUNKS; ++c) {
        QView q(query + (long(view_first) * params.num_heads + head) * HEAD_SIZE + c * kNaxChunk,
                Ext(kNaxChunk, kNaxRows), array<int, 2>({1, params.num_heads * HEAD_SIZE}));
        KView k(kv + c * kNaxChunk, Ext(kNaxChunk, kNaxKeys), array<int, 2>({1, HEAD_SIZE}));
        qk.run(q, k, s);
      }
      s.store(PView(my_scores, Ext(kNaxKeys, kNaxRows)));
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    // The block's values replace its keys.
    nax_load_block<T, HEAD_SIZE, BLOCK_SIZE>(value_cache, kv, table, kb, key_end, token_stride, kv_head,
                                             int(thread_id));
    if (has_rows) {
      // Online softmax of this lane's half row: scores -> probabilities in place.
      float sc[kNaxKeys / 2];
      float block_max = kEmptyMax;
      for (int j = 0; j < kNaxKeys / 2; ++j) {
        const int col = soft_half * (kNaxKeys / 2) + j;
        const int t = kb + col;
        const bool live = row_mine && t >= row_begin && t < row_end;
        sc[j] = live ? finish_score(my_scores[soft_row * kNaxKeys + col] * q_scale, params) : kEmptyMax;
        block_max = max(block_max, sc[j]);
      }
      block_max = max(block_max, simd_shuffle_xor(block_max, 1));
      const float m_new = max(m, block_max);
      const float carry = exp2(m - m_new);
      float block_sum = 0.0f;
      for (int j = 0; j < kNaxKeys / 2; ++j) {
        const int col = soft_half * (kNaxKeys / 2) + j;
        const float p = sc[j] > kEmptyMax ? exp2(sc[j] - m_new) : 0.0f;
        my_scores[soft_row * kNaxKeys + col] = p;
        block_sum += p;
      }
      block_sum += simd_shuffle_xor(block_sum, 1);
      l = l * carry + block_sum;
      m = m_new;
      if (soft_half == 0) my_carries[soft_row] = carry;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (has_rows) {
      PView p(my_scores, Ext(kNaxKeys, kNaxRows));
      for (int c = 0; c < CHUNKS; ++c) {
        for (int i = 0; i < o[c].get_capacity(); ++i) {
          if (o[c].is_valid_element(i)) o[c][i] *= my_carries[o[c].get_multidimensional_index(i)[1]];
        }
        KView v(kv + c * kNaxChunk, Ext(kNaxChunk, kNaxKeys), array<int, 2>({1, HEAD_SIZE}));
        pv.run(p, v, o[c]);
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  // Each row's output factor, then the rows that are this simdgroup's.
  if (has_rows && soft_half == 0) my_carries[soft_row] = output_factor(m, l, head, sinks);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (!has_rows) return;
  for (int c = 0; c < CHUNKS; ++c) {
    for (int i = 0; i < o[c].get_capacity(); ++i) {
      if (!o[c].is_valid_element(i)) continue;
      const auto idx = o[c].get_multidimensional_index(i);
      const int r = view_first + idx[1];
      if (r < my_first || r >= my_end) continue;
      out[(long(r) * params.num_heads + head) * HEAD_SIZE + c * kNaxChunk + idx[0]] =
          T(o[c][i] * my_carries[idx[1]]);
    }
  }
}

#endif  // __HAVE_TENSOR__
