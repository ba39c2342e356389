#include "cpu/attention/paged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "constants.h"
#include "cpu/attention/attention_item.h"
#include "cpu/attention/attention_output.h"
#include "cpu/attention/gqa_decode_cpu.h"
#include "cpu/attention/paged_pieces_cpu.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"
#include "dispatch/dispatch_env.h"
#include "dispatch/paged_metadata.h"

namespace vllm_metal::cpu {

namespace {

using mlx::core::Dtype;

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

struct Scratch {
  std::vector<float> f;
  std::vector<int32_t> i;
};

// Varlen (split_partition = 0) and SplitKv (key ranges cut into split_partition pieces).
class Planner {
 public:
  Planner(const PagedAttentionArgs& p, int split_partition)
      : p_(p),
        split_partition_(split_partition),
        rows_(rows_per_item(p.num_heads)),
        tile_(attention_tile_keys(p.num_kv_heads, p.head_size)),
        kernel_(select_attention_item(p.kv_dtype, p.kv_quant, p.head_size)),
        decode_kernel_(select_decode_item(p.kv_dtype, p.kv_quant, p.head_size)) {}

  void run(ThreadPool& pool) {
    plan();
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

  void plan() {
    // SplitKv: cut long key ranges into pieces that run in parallel and merge
    // their softmax states afterwards.
    const int piece = split_partition_;
    for (int s = 0; s < p_.num_seqs; ++s) {
      const int q_len = p_.cu_seqlens_q[s + 1] - p_.cu_seqlens_q[s];
      const int pos0 = first_position(s);
      // Last chunks first: causal rows there see the most keys.
      for (int r1 = q_len; r1 > 0; r1 -= rows_) {
        const int r0 = std::max(0, r1 - rows_);
        const int key_begin = window_start(pos0 + r0);
        const int key_end = chunk_key_end(p_, s, r0, r1);
        const int span = key_end - key_begin;
        const int parts = piece > 0 ? std::max(1, (span + piece - 1) / piece) : 1;
        if (parts == 1) {
          items_.push_back({s, r0, r1, key_begin, key_end, -1});
          continue;
        }
        groups_.push_back({s, r0, r1, num_partials_, parts});
        for (int k = 0; k < parts; ++k) {
          const int kb = key_begin + k * piece;
          items_.push_back({s, r0, r1, kb, std::min(key_end, kb + piece), num_partials_++});
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

    float* q = scratch.f.data();
    int32_t* row_lo = scratch.i.data();
    int32_t* row_hi = row_lo + rows;
    const int first_token = p_.cu_seqlens_q[w.seq] + w.row_begin;
    const int pos0 = first_position(w.seq) + w.row_begin;
    for (int r = 0; r < rows; ++r) {
      const int pos = pos0 + r;
      row_lo[r] = std::max(window_start(pos), w.key_begin);
      row_hi[r] = std::min(row_key_end(p_, first_token + r, pos, p_.seq_lens[w.seq]), w.key_end);
    }
    // The query rows of this item are contiguous: [rows, num_heads, d].
    AttentionItem a = sequence_item(p_, w.seq, first_token, rows, q, row_lo, row_hi);
    a.acc = q + qd;
    a.m = a.acc + qd;
    a.l = a.m + nq;
    a.k_tile = a.l + nq;
    a.v_tile = a.k_tile + td;
    a.scores = a.v_tile + td;
    a.tile = tile_;
    (rows == 1 ? decode_kernel_ : kernel_)(a);

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
  const int split_partition_;
  const int rows_;
  const int tile_;
  const AttentionItemFn kernel_;
  const AttentionItemFn decode_kernel_;
  std::vector<WorkItem> items_;
  std::vector<MergeGroup> groups_;
  int num_partials_ = 0;
  ScratchVector<float> partials_;
};

std::mutex g_force_mutex;
std::optional<dispatch::PagedRoute> g_forced_route;
int g_forced_partition = kPartitionSize;

dispatch::KernelDtype kernel_dtype(Dtype t) {
  switch (t) {
    case mlx::core::float16:
      return dispatch::KernelDtype::Float16;
    case mlx::core::bfloat16:
      return dispatch::KernelDtype::BFloat16;
    case mlx::core::float32:
      return dispatch::KernelDtype::Float32;
    default:
      return dispatch::KernelDtype::Unsupported;
  }
}

dispatch::PagedDispatch forced_dispatch(const PagedAttentionArgs& p, dispatch::PagedRoute route, int partition) {
  dispatch::PagedDispatch d;
  d.route = route;
  d.reason = "forced";
  if (route == dispatch::PagedRoute::NaxPrefill) {
    throw std::invalid_argument("paged_attention: the NaxPrefill route has no kernel");
  }
  if (route == dispatch::PagedRoute::Varlen) return d;
  if (route == dispatch::PagedRoute::GqaDecode && p.total_q != p.num_seqs) {
    throw std::invalid_argument("paged_attention: forced GqaDecode needs one query row per sequence");
  }
  int longest = 1;
  for (int s = 0; s < p.num_seqs; ++s) longest = std::max(longest, static_cast<int>(p.seq_lens[s]));
  d.partition_size = partition;
  d.num_partitions = (longest + partition - 1) / partition;
  return d;
}

} // namespace

void check_paged_metadata(const PagedAttentionArgs& p) {
  dispatch::check_paged_metadata(
      {p.cu_seqlens_q, p.seq_lens, p.num_seqs, p.total_q, static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size});
}

dispatch::PagedProblem describe_problem(const PagedAttentionArgs& p) {
  dispatch::PagedProblem problem;
  problem.num_heads = p.num_heads;
  problem.num_kv_heads = p.num_kv_heads;
  problem.head_size = p.head_size;
  problem.block_size = p.block_size;
  problem.query_dtype = kernel_dtype(p.query_dtype);
  problem.cache_dtype = kernel_dtype(p.kv_dtype);
  problem.seq_lens.assign(p.seq_lens, p.seq_lens + p.num_seqs);
  problem.query_lens.resize(p.num_seqs);
  for (int s = 0; s < p.num_seqs; ++s) problem.query_lens[s] = p.cu_seqlens_q[s + 1] - p.cu_seqlens_q[s];
  return problem;
}

void force_cpu_route(std::optional<dispatch::PagedRoute> route, int partition_size) {
  if (partition_size < 1) throw std::invalid_argument("partition_size must be >= 1");
  std::lock_guard<std::mutex> lock(g_force_mutex);
  g_forced_route = route;
  g_forced_partition = partition_size;
}

dispatch::PagedDispatch plan_paged_attention_cpu(const PagedAttentionArgs& args) {
  check_paged_metadata(args);
  std::optional<dispatch::PagedRoute> forced;
  int forced_partition;
  {
    std::lock_guard<std::mutex> lock(g_force_mutex);
    forced = g_forced_route;
    forced_partition = g_forced_partition;
  }
  if (forced) return forced_dispatch(args, *forced, forced_partition);
  const dispatch::DispatchEnv env{ThreadPool::instance().size(), dispatch::gqa_decode_disabled()};
  return dispatch::decide_cpu_paged_dispatch(describe_problem(args), env, args.sliding_window);
}

void run_paged_attention_cpu(const PagedAttentionArgs& args, const dispatch::PagedDispatch& d) {
  if (args.total_q == 0) return;
  ThreadPool& pool = ThreadPool::instance();
  // The route only decides how the keys are shared among the threads; the
  // pieces kernel's arithmetic is the same whichever it is.
  if (run_paged_pieces(args, d.route == dispatch::PagedRoute::Varlen ? 0 : d.partition_size, pool)) return;
  if (args.key_columns) {
    throw std::invalid_argument("paged_attention: key columns are read by the pieces kernel only "
                                "(float caches, head sizes 64, 128, 256)");
  }
  switch (d.route) {
    case dispatch::PagedRoute::GqaDecode:
      gqa_decode_cpu(args, d.partition_size, pool);
      break;
    case dispatch::PagedRoute::SplitKv:
      Planner(args, d.partition_size).run(pool);
      break;
    default:
      Planner(args, 0).run(pool);
  }
}

dispatch::PagedDispatch paged_attention_cpu(const PagedAttentionArgs& args) {
  const dispatch::PagedDispatch d = plan_paged_attention_cpu(args);
  run_paged_attention_cpu(args, d);
  return d;
}

} // namespace vllm_metal::cpu
