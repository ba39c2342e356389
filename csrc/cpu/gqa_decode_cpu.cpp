#include "cpu/gqa_decode_cpu.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cpu/attention_item.h"
#include "cpu/attention_output.h"
#include "cpu/tile_math.h"

namespace vllm_metal::cpu {

void gqa_decode_cpu(const PagedAttentionArgs& p, int partition_size, int num_partitions, ThreadPool& pool) {
  if (p.total_q != p.num_seqs) {
    throw std::invalid_argument("paged_attention: GQA decode needs one query row per sequence");
  }
  if (partition_size < 1 || num_partitions < 1) throw std::invalid_argument("paged_attention: bad partitions");
  const int d = p.head_size;
  const int h = p.num_heads;
  const int tile = attention_tile_keys(p.num_kv_heads, d);
  const AttentionItemFn kernel = select_attention_item(p.kv_dtype, d);
  const float q_scale = p.softcap > 0.0f ? p.scale : p.scale * kLog2e;
  const bool split = num_partitions > 1;
  // Split: (max, exp-sum, unnormalized output) per (sequence, head, partition).
  const int64_t slots = int64_t(p.num_seqs) * h * num_partitions;
  std::vector<float> state(split ? static_cast<size_t>(slots) * (d + 2) : 0);
  float* state_m = state.data();
  float* state_l = state_m + (split ? slots : 0);
  float* state_acc = state_l + (split ? slots : 0);

  pool.parallel_for(p.num_seqs * num_partitions, [&](int item) {
    const int seq = item / num_partitions;
    const int part = item % num_partitions;
    const int context = p.seq_lens[seq];
    int key_begin = p.sliding_window > 0 ? std::max(0, context - p.sliding_window) : 0;
    int key_end = context;
    if (split) {
      key_begin = std::max(key_begin, part * partition_size);
      key_end = std::min(key_end, (part + 1) * partition_size);
    }
    thread_local std::vector<float> scratch;
    const size_t qd = static_cast<size_t>(h) * d;
    const size_t td = static_cast<size_t>(tile) * p.num_kv_heads * d;
    scratch.resize(2 * qd + 2 * static_cast<size_t>(h) + 2 * td + tile + kLanes);
    AttentionItem a;
    float* q = scratch.data();
    a.acc = q + qd;
    a.m = a.acc + qd;
    a.l = a.m + h;
    a.k_tile = a.l + h;
    a.v_tile = a.k_tile + td;
    a.scores = a.v_tile + td;
    const int32_t row_lo = key_begin;
    const int32_t row_hi = std::max(key_begin, key_end);
    load_span(p.query, p.query_dtype, int64_t(seq) * qd, q, int64_t(qd), q_scale);
    a.key_cache = p.key_cache;
    a.value_cache = p.value_cache;
    a.block_table = p.block_tables + int64_t(seq) * p.max_blocks_per_seq;
    a.num_blocks = p.num_blocks;
    a.block_size = p.block_size;
    a.num_kv_heads = p.num_kv_heads;
    a.head_size = d;
    a.q = q;
    a.rows = 1;
    a.group = h / p.num_kv_heads;  // the group's heads share each decoded K/V tile
    a.row_lo = &row_lo;
    a.row_hi = &row_hi;
    a.softcap = p.softcap;
    a.tile = tile;
    kernel(a);
    for (int head = 0; head < h; ++head) {
      const float* acc = a.acc + int64_t(head) * d;
      if (!split) {
        write_output(p, seq, head, a.m[head], a.l[head], acc);
        continue;
      }
      const int64_t slot = (int64_t(seq) * h + head) * num_partitions + part;
      state_m[slot] = a.m[head];
      state_l[slot] = a.l[head];
      std::copy(acc, acc + d, state_acc + slot * d);
    }
  });
  if (!split) return;
  pool.parallel_for(p.num_seqs, [&](int seq) {
    thread_local std::vector<float> merged;
    merged.resize(d);
    for (int head = 0; head < h; ++head) {
      const int64_t first = (int64_t(seq) * h + head) * num_partitions;
      merge_and_write(p, seq, head, num_partitions, state_m + first, state_l + first, state_acc + first * d, d,
                      merged.data());
    }
  });
}

}  // namespace vllm_metal::cpu
