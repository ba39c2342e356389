#include "cpu/paged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "constants.h"
#include "cpu/attention_item.h"
#include "cpu/thread_pool.h"
#include "cpu/tile_math.h"

namespace vllm_metal::cpu {

namespace {

using mlx::core::Dtype;

constexpr float kLog2e = 1.4426950408889634f;

// Query rows per work item: about 128 query vectors (rows x heads) per item,
// so each gathered K/V tile is reused many times during prefill.
int rows_per_item(int num_heads) {
  return std::clamp(128 / num_heads, 1, 32);
}

struct WorkItem {
  int seq;
  int row_begin; // query rows of the sequence, [row_begin, row_end)
  int row_end;
  int key_begin; // key positions this item covers, [key_begin, key_end)
  int key_end;
  int partial; // slot in the split-KV scratch, or -1: write output directly
};

struct MergeGroup {
  int seq;
  int row_begin;
  int row_end;
  int first_partial;
  int num_partials;
};

void check_metadata(const PagedAttentionArgs& p) {
  const int32_t* cu = p.cu_seqlens_q;
  if (cu[0] != 0) {
    throw std::invalid_argument(
        "paged_attention: cu_seqlens_q[0] must be 0, got " + std::to_string(cu[0]));
  }
  if (cu[p.num_seqs] != p.total_q) {
    throw std::invalid_argument(
        "paged_attention: cu_seqlens_q[-1] must equal query.shape[0] = " +
        std::to_string(p.total_q) + ", got " + std::to_string(cu[p.num_seqs]));
  }
  const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = cu[s + 1] - cu[s];
    if (q_len < 0) {
      throw std::invalid_argument(
          "paged_attention: cu_seqlens_q must be non-decreasing (index " +
          std::to_string(s) + ")");
    }
    const int ctx = p.seq_lens[s];
    if (ctx < q_len) {
      throw std::invalid_argument(
          "paged_attention: seq_lens[" + std::to_string(s) + "] = " +
          std::to_string(ctx) + " is smaller than its " + std::to_string(q_len) +
          " query tokens");
    }
    if (ctx > capacity) {
      throw std::invalid_argument(
          "paged_attention: seq_lens[" + std::to_string(s) + "] = " +
          std::to_string(ctx) + " exceeds block_tables capacity " +
          std::to_string(capacity) + " (max_blocks * block_size)");
    }
  }
}

// dst[0:n] = float(src[offset : offset + n]) * mul, for any float dtype.
void load_span(const void* src, Dtype dtype, int64_t offset, float* dst, int64_t n, float mul) {
  switch (dtype) {
    case mlx::core::float16:
      decode_span<F16>(static_cast<const uint16_t*>(src) + offset, dst, n, mul);
      break;
    case mlx::core::bfloat16:
      decode_span<BF16>(static_cast<const uint16_t*>(src) + offset, dst, n, mul);
      break;
    default:
      decode_span<F32>(static_cast<const float*>(src) + offset, dst, n, mul);
  }
}

// dst[offset : offset + n] = src[0:n] * mul, rounded to dtype.
void store_span(void* dst, Dtype dtype, int64_t offset, const float* src, int64_t n, float mul) {
  switch (dtype) {
    case mlx::core::float16:
      encode_span<F16>(src, static_cast<uint16_t*>(dst) + offset, n, mul);
      break;
    case mlx::core::bfloat16:
      encode_span<BF16>(src, static_cast<uint16_t*>(dst) + offset, n, mul);
      break;
    default:
      encode_span<F32>(src, static_cast<float*>(dst) + offset, n, mul);
  }
}

// 2^(x - y) for y >= x, where x may be -inf.
float exp2_diff(float x, float y) {
  return x == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp2(x - y);
}

// Normalize one (token, head) from its softmax state and write it out; the
// sink, if any, adds 2^(sink - max) to the denominator only.
void write_output(
    const PagedAttentionArgs& p,
    int token,
    int head,
    float m,
    float l,
    const float* acc) {
  float carry = 1.0f;
  if (p.sinks != nullptr) {
    const float sink = p.sinks[head] * kLog2e;
    const float m_all = std::max(m, sink);
    carry = exp2_diff(m, m_all);
    l = l * carry + std::exp2(sink - m_all);
  }
  const float inv = l > 0.0f ? carry / l : 0.0f; // nothing attended -> zeros
  const int64_t offset = (static_cast<int64_t>(token) * p.num_heads + head) * p.head_size;
  store_span(p.out, p.query_dtype, offset, acc, p.head_size, inv);
}

struct Scratch {
  std::vector<float> f;
  std::vector<int32_t> i;
};

class Planner {
 public:
  explicit Planner(const PagedAttentionArgs& p)
      : p_(p),
        rows_(rows_per_item(p.num_heads)),
        tile_(attention_tile_keys(p.num_kv_heads, p.head_size)),
        kernel_(select_attention_item(p.kv_dtype, p.head_size)) {}

  void run(ThreadPool& pool) {
    plan(pool.size());
    partials_.assign(static_cast<size_t>(num_partials_) * slot_floats(), 0.0f);
    pool.parallel_for(static_cast<int>(items_.size()), [this](int i) { run_item(items_[i]); });
    pool.parallel_for(static_cast<int>(groups_.size()), [this](int i) { merge(groups_[i]); });
  }

 private:
  size_t slot_floats() const {
    return static_cast<size_t>(rows_) * p_.num_heads * (p_.head_size + 2);
  }

  const float* slot(int k) const {
    return partials_.data() + static_cast<size_t>(k) * slot_floats();
  }

  int first_position(int seq) const {
    return p_.seq_lens[seq] - (p_.cu_seqlens_q[seq + 1] - p_.cu_seqlens_q[seq]);
  }

  int window_start(int pos) const {
    return p_.sliding_window > 0 ? std::max(0, pos - p_.sliding_window + 1) : 0;
  }

  void plan(int num_threads) {
    int64_t base_items = 0;
    for (int s = 0; s < p_.num_seqs; ++s) {
      const int q_len = p_.cu_seqlens_q[s + 1] - p_.cu_seqlens_q[s];
      base_items += (q_len + rows_ - 1) / rows_;
    }
    // Too few items to keep every thread busy: cut long key ranges into
    // PARTITION_SIZE pieces and merge their softmax states afterwards.
    const bool split = num_threads > 1 && base_items < 2 * num_threads;
    for (int s = 0; s < p_.num_seqs; ++s) {
      const int q_len = p_.cu_seqlens_q[s + 1] - p_.cu_seqlens_q[s];
      const int pos0 = first_position(s);
      // Last chunks first: causal rows there see the most keys.
      for (int r1 = q_len; r1 > 0; r1 -= rows_) {
        const int r0 = std::max(0, r1 - rows_);
        const int key_begin = window_start(pos0 + r0);
        const int key_end = pos0 + r1; // the last row attends up to itself
        const int span = key_end - key_begin;
        const int parts = split ? std::max(1, (span + kPartitionSize - 1) / kPartitionSize) : 1;
        if (parts == 1) {
          items_.push_back({s, r0, r1, key_begin, key_end, -1});
          continue;
        }
        groups_.push_back({s, r0, r1, num_partials_, parts});
        for (int k = 0; k < parts; ++k) {
          const int kb = key_begin + k * kPartitionSize;
          items_.push_back({s, r0, r1, kb, std::min(key_end, kb + kPartitionSize), num_partials_++});
        }
      }
    }
  }

  void run_item(const WorkItem& w) {
    thread_local Scratch scratch;
    const int d = p_.head_size;
    const int rows = w.row_end - w.row_begin;
    const int nq = rows * p_.num_heads;
    const size_t qd = static_cast<size_t>(nq) * d;
    const size_t td = static_cast<size_t>(tile_) * p_.num_kv_heads * d;
    scratch.f.resize(2 * qd + 2 * static_cast<size_t>(nq) + 2 * td + tile_ + kLanes);
    scratch.i.resize(2 * static_cast<size_t>(rows));

    AttentionItem a;
    float* q = scratch.f.data();
    a.acc = q + qd;
    a.m = a.acc + qd;
    a.l = a.m + nq;
    a.k_tile = a.l + nq;
    a.v_tile = a.k_tile + td;
    a.scores = a.v_tile + td;
    int32_t* row_lo = scratch.i.data();
    int32_t* row_hi = row_lo + rows;

    const int first_token = p_.cu_seqlens_q[w.seq] + w.row_begin;
    const int pos0 = first_position(w.seq) + w.row_begin;
    for (int r = 0; r < rows; ++r) {
      const int pos = pos0 + r;
      row_lo[r] = std::max(window_start(pos), w.key_begin);
      row_hi[r] = std::min(pos + 1, w.key_end);
    }
    // The query rows of this item are contiguous: [rows, num_heads, d].
    const float q_scale = p_.softcap > 0.0f ? p_.scale : p_.scale * kLog2e;
    load_span(p_.query, p_.query_dtype, static_cast<int64_t>(first_token) * p_.num_heads * d,
              q, static_cast<int64_t>(qd), q_scale);

    a.key_cache = p_.key_cache;
    a.value_cache = p_.value_cache;
    a.block_table = p_.block_tables + static_cast<int64_t>(w.seq) * p_.max_blocks_per_seq;
    a.num_blocks = p_.num_blocks;
    a.block_size = p_.block_size;
    a.num_kv_heads = p_.num_kv_heads;
    a.head_size = d;
    a.q = q;
    a.rows = rows;
    a.group = p_.num_heads / p_.num_kv_heads;
    a.row_lo = row_lo;
    a.row_hi = row_hi;
    a.softcap = p_.softcap;
    a.tile = tile_;
    kernel_(a);

    if (w.partial >= 0) {
      float* dst = partials_.data() + static_cast<size_t>(w.partial) * slot_floats();
      std::copy(a.m, a.m + nq, dst);
      std::copy(a.l, a.l + nq, dst + nq);
      std::copy(a.acc, a.acc + qd, dst + 2 * nq);
      return;
    }
    for (int i = 0; i < nq; ++i) {
      write_output(p_, first_token + i / p_.num_heads, i % p_.num_heads, a.m[i], a.l[i],
                   a.acc + static_cast<int64_t>(i) * d);
    }
  }

  // Combine the split-KV softmax states of one item group and write it out.
  void merge(const MergeGroup& grp) {
    const int d = p_.head_size;
    const int nq = (grp.row_end - grp.row_begin) * p_.num_heads;
    thread_local std::vector<float> acc;
    acc.resize(d);
    const int first_token = p_.cu_seqlens_q[grp.seq] + grp.row_begin;
    for (int i = 0; i < nq; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int k = 0; k < grp.num_partials; ++k) {
        m = std::max(m, slot(grp.first_partial + k)[i]);
      }
      float l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int k = 0; k < grp.num_partials; ++k) {
        const float* s = slot(grp.first_partial + k);
        const float w = exp2_diff(s[i], m);
        if (w == 0.0f) continue;
        l += s[nq + i] * w;
        const float* part = s + 2 * nq + static_cast<int64_t>(i) * d;
        for (int j = 0; j < d; ++j) acc[j] += part[j] * w;
      }
      write_output(p_, first_token + i / p_.num_heads, i % p_.num_heads, m, l, acc.data());
    }
  }

  const PagedAttentionArgs& p_;
  const int rows_;
  const int tile_;
  const AttentionItemFn kernel_;
  std::vector<WorkItem> items_;
  std::vector<MergeGroup> groups_;
  int num_partials_ = 0;
  std::vector<float> partials_;
};

} // namespace

void paged_attention_cpu(const PagedAttentionArgs& args) {
  check_metadata(args);
  if (args.total_q == 0) return;
  Planner(args).run(ThreadPool::instance());
}

} // namespace vllm_metal::cpu
