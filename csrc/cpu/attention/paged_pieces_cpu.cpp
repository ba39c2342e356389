#include "cpu/attention/paged_pieces_cpu.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "cpu/attention/attention_item.h"
#include "cpu/attention/attention_output.h"
#include "cpu/runtime/scratch.h"

namespace vllm_metal::cpu {

namespace {

// Split states above this stay unsplit (one item per chunk): a long prompt's
// chunks already give the threads enough items.
constexpr int64_t kMaxSplitBytes = int64_t(256) << 20;
// Query vectors per fold task of a split chunk.
constexpr int kMergeVectors = 8;

struct Chunk {
  int seq;
  int row_begin; // query rows [row_begin, row_end) of the sequence
  int row_end;
  int first_item;
  int num_items;
  int64_t head; // split chunks: item 0's folded states in the split scratch
};

struct Item {
  int chunk;
  int index;     // within the chunk: 0 folds, the others keep one state per piece
  int key_lo;    // a segment start
  int key_hi;
  int64_t states; // index > 0: its pieces' states in the split scratch
};

class PiecePlan {
 public:
  PiecePlan(const PagedAttentionArgs& p, AttentionItemFn kernel)
      : p_(p), kernel_(kernel), heads_(p.num_heads), d_(p.head_size) {}

  void run(int split_keys, ThreadPool& pool) {
    plan(split_keys);
    if (split_floats() * 4 > kMaxSplitBytes) plan(0);
    // Uninitialized: the kernel resets each piece's states as the piece starts, and
    // item 0 writes each split chunk's head states (a zero-filled vector here cleared
    // ~1 MB a layer at 8k keys on the stream thread while the pool waited).
    m_ = scratch_array<float>(split_states_);
    l_ = scratch_array<float>(split_states_);
    acc_ = scratch_array<float>(split_states_ * d_);
    pool.parallel_for(static_cast<int>(items_.size()),
                      [this](int i) { run_item(items_[order_[i]]); });
    if (split_.empty()) return;
    // Then the split chunks' folds, kMergeVectors query vectors a task: a long
    // decode row's 128 pieces a head, folded by one thread while the other
    // waited, took ~5% of a decode step at 8k keys (1.1B shape).
    merges_.clear();
    for (int c : split_) {
      for (int i0 = 0; i0 < nq(chunks_[c]); i0 += kMergeVectors) merges_.push_back({c, i0});
    }
    pool.parallel_for(static_cast<int>(merges_.size()), [this](int t) {
      const Merge& m = merges_[t];
      merge(m.chunk, m.first, std::min(nq(chunks_[m.chunk]), m.first + kMergeVectors));
    });
  }

 private:
  int64_t split_floats() const { return split_states_ * (d_ + 2); }

  int first_position(int seq) const {
    return p_.seq_lens[seq] - (p_.cu_seqlens_q[seq + 1] - p_.cu_seqlens_q[seq]);
  }

  int window_start(int pos) const {
    return p_.sliding_window > 0 ? std::max(0, pos - p_.sliding_window + 1) : 0;
  }

  int nq(const Chunk& c) const { return (c.row_end - c.row_begin) * heads_; }

  void plan(int split_keys) {
    chunks_.clear();
    items_.clear();
    split_.clear();
    split_states_ = 0;
    for (int s = 0; s < p_.num_seqs; ++s) {
      const int q_len = p_.cu_seqlens_q[s + 1] - p_.cu_seqlens_q[s];
      const int pos0 = first_position(s);
      for (int r0 = 0; r0 < q_len; r0 += kPieceRows) {
        const int r1 = std::min(q_len, r0 + kPieceRows);
        const int lo = window_start(pos0 + r0); // rows' windows start in row order
        const int hi = chunk_key_end(p_, s, r0, r1);
        // The segment (block and piece) holding lo: vectors start there.
        const int key_lo = std::max(lo / p_.block_size * p_.block_size, lo / kPieceKeys * kPieceKeys);
        const int first = key_lo / kPieceKeys;
        const int pieces = (hi - 1) / kPieceKeys - first + 1;
        int n = 1;
        if (split_keys > 0) n = std::clamp((hi - key_lo + split_keys - 1) / split_keys, 1, pieces);
        const int c = static_cast<int>(chunks_.size());
        chunks_.push_back({s, r0, r1, static_cast<int>(items_.size()), n, -1});
        const int64_t states = int64_t(r1 - r0) * heads_;
        if (n > 1) {
          chunks_.back().head = split_states_;
          split_states_ += states;
          split_.push_back(c);
        }
        for (int k = 0; k < n; ++k) {
          const int p0 = first + static_cast<int>(int64_t(pieces) * k / n);
          const int p1 = first + static_cast<int>(int64_t(pieces) * (k + 1) / n);
          Item it{c, k, k == 0 ? key_lo : p0 * kPieceKeys, std::min(hi, p1 * kPieceKeys), -1};
          if (k > 0) {
            it.states = split_states_;
            split_states_ += int64_t(p1 - p0) * states;
          }
          items_.push_back(it);
        }
      }
    }
    // Longest items first: the pool hands them out in order, the short ones fill the gaps.
    order_.resize(items_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int>(i);
    std::stable_sort(order_.begin(), order_.end(), [this](int a, int b) {
      const Item& x = items_[a];
      const Item& y = items_[b];
      return int64_t(x.key_hi - x.key_lo) * rows(x) > int64_t(y.key_hi - y.key_lo) * rows(y);
    });
  }

  int rows(const Item& it) const {
    const Chunk& c = chunks_[it.chunk];
    return c.row_end - c.row_begin;
  }

  void run_item(const Item& it) {
    const Chunk& c = chunks_[it.chunk];
    const int rows = c.row_end - c.row_begin;
    const int n = nq(c);
    const size_t qd = static_cast<size_t>(n) * d_;
    thread_local ScratchVector<float> scratch;
    thread_local std::vector<int32_t> bounds;
    // q, and for the folding item its piece and its folded states.
    const bool fold = it.index == 0;
    scratch.resize(qd + (fold ? 2 * (qd + 2 * static_cast<size_t>(n)) : 0));
    bounds.resize(2 * static_cast<size_t>(rows));
    float* q = scratch.data();

    const int first_token = p_.cu_seqlens_q[c.seq] + c.row_begin;
    const int pos0 = first_position(c.seq) + c.row_begin;
    int32_t* row_lo = bounds.data();
    int32_t* row_hi = row_lo + rows;
    for (int r = 0; r < rows; ++r) {
      row_lo[r] = window_start(pos0 + r);
      row_hi[r] = row_key_end(p_, first_token + r, pos0 + r, p_.seq_lens[c.seq]);
    }
    AttentionItem a = sequence_item(p_, c.seq, first_token, rows, q, row_lo, row_hi);
    a.key_lo = it.key_lo;
    a.key_hi = it.key_hi;
    a.piece = kPieceKeys;
    if (!fold) {
      a.m = m_.get() + it.states;
      a.l = l_.get() + it.states;
      a.acc = acc_.get() + it.states * d_;
      kernel_(a);
      return;
    }
    a.acc = q + qd;
    a.m = a.acc + qd;
    a.l = a.m + n;
    a.fold_acc = a.l + n;
    a.fold_m = a.fold_acc + qd;
    a.fold_l = a.fold_m + n;
    std::fill(a.fold_m, a.fold_m + n, -std::numeric_limits<float>::infinity());
    std::fill(a.fold_l, a.fold_l + n, 0.0f);
    std::fill(a.fold_acc, a.fold_acc + qd, 0.0f);
    kernel_(a);
    if (c.num_items == 1) {
      for (int i = 0; i < n; ++i) {
        write_output(p_, first_token + i / heads_, i % heads_, a.fold_m[i], a.fold_l[i],
                     a.fold_acc + static_cast<int64_t>(i) * d_);
      }
      return;
    }
    std::copy(a.fold_m, a.fold_m + n, m_.get() + c.head);
    std::copy(a.fold_l, a.fold_l + n, l_.get() + c.head);
    std::copy(a.fold_acc, a.fold_acc + qd, acc_.get() + c.head * d_);
  }

  // Query vectors [i0, i1) of a split chunk: item 0's folded states, then every
  // later piece, left to right.
  void merge(int chunk, int i0, int i1) {
    const Chunk& c = chunks_[chunk];
    const int n = nq(c);
    const int first_token = p_.cu_seqlens_q[c.seq] + c.row_begin;
    const int item = c.first_item;
    for (int i = i0; i < i1; ++i) {
      const int64_t h = c.head + i;
      float m = m_[h], l = l_[h];
      float* acc = acc_.get() + h * d_;
      for (int k = 1; k < c.num_items; ++k) {
        const Item& it = items_[item + k];
        const int pieces = (it.key_hi - 1) / kPieceKeys - it.key_lo / kPieceKeys + 1;
        for (int pc = 0; pc < pieces; ++pc) {
          const int64_t s = it.states + int64_t(pc) * n + i;
          fold_state(m, l, acc, m_[s], l_[s], acc_.get() + s * d_, d_);
        }
      }
      write_output(p_, first_token + i / heads_, i % heads_, m, l, acc);
    }
  }

  const PagedAttentionArgs& p_;
  const AttentionItemFn kernel_;
  const int heads_;
  const int d_;
  std::vector<Chunk> chunks_;
  std::vector<Item> items_;
  std::vector<int> order_;
  std::vector<int> split_;
  int64_t split_states_ = 0;
  ScratchArray<float> m_, l_, acc_;
  struct Merge {
    int chunk;
    int first; // query vector
  };
  std::vector<Merge> merges_;
};

} // namespace

bool run_paged_pieces(const PagedAttentionArgs& p, int split_keys, ThreadPool& pool) {
  const AttentionItemFn kernel = select_pieces_item(p.kv_dtype, p.kv_quant, p.head_size);
  if (kernel == nullptr) return false;
  if (p.total_q > 0) PiecePlan(p, kernel).run(split_keys, pool);
  return true;
}

} // namespace vllm_metal::cpu
