#include "cpu/mla/mla_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/isa.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Keys per tile: decoded to fp32 once and read by every head of the item.
constexpr int kKeyTile = 32;
constexpr float kLog2e = 1.4426950408889634f;

// One work item: query row `row` (at position `pos`) of a sequence, heads [h0, h1).
struct Item {
  int seq;
  int row;
  int pos;
  int h0, h1;
};

// Per-thread buffers of an item.
struct ItemScratch {
  ScratchVector<float> q;    // [heads, width]: [q_c, q_pe] * scale * log2(e)
  ScratchVector<float> keys; // [kKeyTile, width]
  ScratchVector<float> acc;  // [heads, rank]
  ScratchVector<float> s;    // [kKeyTile] scores of one head
};

// The item's heads over its keys: online softmax in log2 space, fp32.
VLLM_METAL_INLINE void item_body(const MlaAttentionArgs& a, const Item& it, ItemScratch& w) {
  const int rank = a.rank, width = a.rank + a.rope_dim, heads = it.h1 - it.h0;
  const int64_t tq = a.cu_seqlens_q[it.seq] + it.row;
  w.q.resize(static_cast<size_t>(heads) * width);
  w.acc.assign(static_cast<size_t>(heads) * rank, 0.0f);
  w.keys.resize(static_cast<size_t>(kKeyTile) * width);
  w.s.resize(kKeyTile);
  const float mul = a.scale * kLog2e;
  for (int h = 0; h < heads; ++h) {
    const int64_t head = tq * a.num_heads + it.h0 + h;
    driver::load_row(a.q_latent, a.q_type, head * rank, rank, w.q.data() + h * width);
    driver::load_row(a.q_pe, a.q_type, head * a.rope_dim, a.rope_dim,
                     w.q.data() + h * width + rank);
    scale_row<0>(w.q.data() + h * width, mul, width);
  }
  std::vector<float> m(heads, -std::numeric_limits<float>::infinity()), l(heads, 0.0f);
  const int32_t* table = a.block_tables + static_cast<int64_t>(it.seq) * a.max_blocks_per_seq;
  const int keys = it.pos + 1;
  for (int k0 = 0; k0 < keys; k0 += kKeyTile) {
    const int nk = std::min(kKeyTile, keys - k0);
    for (int j = 0; j < nk; ++j) {
      const int key = k0 + j;
      const int64_t slot = static_cast<int64_t>(table[key / a.block_size]) * a.block_size +
          key % a.block_size;
      driver::load_row(a.cache, a.cache_type, slot * width, width, w.keys.data() + j * width);
    }
    const int n16 = (nk + kLanes - 1) / kLanes * kLanes;
    for (int h = 0; h < heads; ++h) {
      float* s = w.s.data();
      dot_rows<0>(w.q.data() + h * width, w.keys.data(), width, nk, s, width);
      for (int j = nk; j < n16; ++j) s[j] = -std::numeric_limits<float>::infinity();
      const float m_new = std::max(m[h], max_padded(s, n16));
      const float correction = exp2_nonpositive(m[h] - m_new);
      const float sum = exp2_shifted_padded(s, n16, m_new);
      l[h] = l[h] * correction + sum;
      m[h] = m_new;
      float* acc = w.acc.data() + static_cast<int64_t>(h) * rank;
      scale_row<0>(acc, correction, rank);
      accumulate_rows<0>(s, w.keys.data(), width, nk, acc, rank);
    }
  }
  for (int h = 0; h < heads; ++h) {
    float* acc = w.acc.data() + static_cast<int64_t>(h) * rank;
    scale_row<0>(acc, 1.0f / l[h], rank);
    driver::store_row(acc, nullptr, rank, a.out, a.out_type,
                      (tq * a.num_heads + it.h0 + h) * rank);
  }
}

void item_generic(const MlaAttentionArgs& a, const Item& it, ItemScratch& w) {
  item_body(a, it, w);
}
#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void item_avx512(const MlaAttentionArgs& a, const Item& it,
                                          ItemScratch& w) {
  item_body(a, it, w);
}
VLLM_METAL_TARGET_AVX2 void item_avx2(const MlaAttentionArgs& a, const Item& it, ItemScratch& w) {
  item_body(a, it, w);
}
#endif

void run_item(const MlaAttentionArgs& a, const Item& it, ItemScratch& w) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return item_avx512(a, it, w);
    case Isa::Avx2: return item_avx2(a, it, w);
    default: break;
  }
#endif
  item_generic(a, it, w);
}

[[noreturn]] void bad(const std::string& msg) {
  throw std::invalid_argument("mla_attention: " + msg);
}

void check(const MlaAttentionArgs& a) {
  if (a.cu_seqlens_q[0] != 0 || a.cu_seqlens_q[a.num_seqs] != a.total_q) {
    bad("cu_seqlens_q must start at 0 and end at the query rows");
  }
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.cu_seqlens_q[s + 1] - a.cu_seqlens_q[s];
    const int len = a.seq_lens[s];
    if (q_len < 0) bad("cu_seqlens_q must not decrease");
    if (len < q_len) {
      bad("sequence " + std::to_string(s) + " has " + std::to_string(q_len) +
          " query rows but seq_len " + std::to_string(len));
    }
    if (q_len == 0) continue;
    if (len > static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size) {
      bad("sequence " + std::to_string(s) + " is longer than its block table");
    }
    const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
    for (int b = 0; b < (len + a.block_size - 1) / a.block_size; ++b) {
      if (table[b] < 0 || table[b] >= a.num_blocks) {
        throw std::out_of_range("mla_attention: block id " + std::to_string(table[b]) +
                                " of sequence " + std::to_string(s) + " is outside [0, " +
                                std::to_string(a.num_blocks) + ")");
      }
    }
  }
}

} // namespace

void mla_attention_cpu(const MlaAttentionArgs& a) {
  if (a.total_q == 0 || a.num_heads == 0) return;
  check(a);
  std::vector<Item> items;
  const int threads = ThreadPool::instance().size();
  int rows = 0;
  for (int s = 0; s < a.num_seqs; ++s) rows += a.cu_seqlens_q[s + 1] - a.cu_seqlens_q[s];
  // Few rows (a decode step): split each row's heads so every thread has work;
  // each split reads the row's keys again, from cache.
  const int splits = std::min(a.num_heads, std::max(1, (2 * threads + rows - 1) / rows));
  const int per = (a.num_heads + splits - 1) / splits;
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.cu_seqlens_q[s + 1] - a.cu_seqlens_q[s];
    for (int r = 0; r < q_len; ++r) {
      for (int h0 = 0; h0 < a.num_heads; h0 += per) {
        items.push_back({s, r, a.seq_lens[s] - q_len + r, h0, std::min(a.num_heads, h0 + per)});
      }
    }
  }
  // Longest first: the last items to start are the short ones.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.pos > y.pos; });
  ThreadPool::instance().parallel_for(static_cast<int>(items.size()), [&](int i) {
    thread_local ItemScratch w;
    run_item(a, items[i], w);
  });
}

void latent_cache_write_cpu(const LatentWriteArgs& a) {
  const int width = a.rank + a.rope_dim;
  for (int64_t t = 0; t < a.t; ++t) {
    if (a.slots[t] >= a.num_slots) {
      throw std::out_of_range("latent_cache_write: slot " + std::to_string(a.slots[t]) +
                              " is past the cache's " + std::to_string(a.num_slots) + " slots");
    }
  }
  std::vector<float> row(width);
  for (int64_t t = 0; t < a.t; ++t) {
    const int64_t slot = a.slots[t];
    if (slot < 0) continue;
    driver::load_row(a.latent, a.src_type, t * a.rank, a.rank, row.data());
    driver::load_row(a.k_pe, a.src_type, t * a.rope_dim, a.rope_dim, row.data() + a.rank);
    driver::store_row(row.data(), nullptr, width, a.cache, a.cache_type, slot * width);
  }
}

} // namespace vllm_metal::cpu
