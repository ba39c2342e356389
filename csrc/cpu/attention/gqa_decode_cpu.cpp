#include "cpu/attention/gqa_decode_cpu.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <vector>

#include "cpu/attention/attention_item.h"
#include "cpu/attention/attention_output.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

struct Piece {
  int seq;
  int key_begin; // keys [key_begin, key_end) of the sequence
  int key_end;
  int index; // piece of its sequence, 0 .. pieces - 1
};

struct SeqPieces {
  int first_state; // slot of piece 0 in the state arrays, or -1: one piece, no merge
  int pieces;
};

} // namespace

void gqa_decode_cpu(const PagedAttentionArgs& p, int partition_size, ThreadPool& pool) {
  if (p.total_q != p.num_seqs) {
    throw std::invalid_argument("paged_attention: GQA decode needs one query row per sequence");
  }
  if (partition_size < 1) throw std::invalid_argument("paged_attention: partition_size must be >= 1");
  const int d = p.head_size;
  const int h = p.num_heads;
  const int tile = attention_tile_keys(p.num_kv_heads, d);
  const AttentionItemFn kernel = select_decode_item(p.kv_dtype, p.kv_quant, d);

  std::vector<Piece> items;
  std::vector<SeqPieces> seqs(p.num_seqs);
  items.reserve(p.num_seqs);
  int states = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int context = p.seq_lens[s];
    const int begin = p.sliding_window > 0 ? std::max(0, context - p.sliding_window) : 0;
    const int span = context - begin;
    const int n = std::max(1, (span + partition_size - 1) / partition_size);
    seqs[s] = {n > 1 ? states : -1, n};
    if (n > 1) states += n;
    // Equal pieces: boundaries at begin + span * k / n.
    for (int k = 0; k < n; ++k) {
      items.push_back({s, begin + static_cast<int>(int64_t(span) * k / n),
                       begin + static_cast<int>(int64_t(span) * (k + 1) / n), k});
    }
  }
  // Longest pieces first: the pool hands items out in order, so the short
  // ones fill the gaps at the end.
  std::stable_sort(items.begin(), items.end(), [](const Piece& a, const Piece& b) {
    return a.key_end - a.key_begin > b.key_end - b.key_begin;
  });
  // Split sequences: (max, exp-sum, unnormalized output) per (piece, head),
  // and a count of pieces still running.
  ScratchVector<float> state(static_cast<size_t>(states) * h * (d + 2));
  float* state_m = state.data();
  float* state_l = state_m + static_cast<size_t>(states) * h;
  float* state_acc = state_l + static_cast<size_t>(states) * h;
  std::unique_ptr<std::atomic<int>[]> remaining(states > 0 ? new std::atomic<int>[p.num_seqs] : nullptr);
  if (states > 0) {
    for (int s = 0; s < p.num_seqs; ++s) remaining[s].store(seqs[s].pieces, std::memory_order_relaxed);
  }

  pool.parallel_for(static_cast<int>(items.size()), [&](int item) {
    const Piece& w = items[item];
    thread_local std::vector<float> scratch;
    const size_t qd = static_cast<size_t>(h) * d;
    const size_t td = static_cast<size_t>(tile) * p.num_kv_heads * d;
    scratch.resize(2 * qd + 2 * static_cast<size_t>(h) + 2 * td + tile + kLanes);
    float* q = scratch.data();
    const int32_t row_lo = w.key_begin;
    const int32_t row_hi = std::max(w.key_begin, w.key_end);
    AttentionItem a = sequence_item(p, w.seq, w.seq, 1, q, &row_lo, &row_hi);
    a.acc = q + qd;
    a.m = a.acc + qd;
    a.l = a.m + h;
    a.k_tile = a.l + h;
    a.v_tile = a.k_tile + td;
    a.scores = a.v_tile + td;
    a.tile = tile;
    kernel(a);
    const SeqPieces& sp = seqs[w.seq];
    if (sp.first_state < 0) {
      for (int head = 0; head < h; ++head) {
        write_output(p, w.seq, head, a.m[head], a.l[head], a.acc + int64_t(head) * d);
      }
      return;
    }
    // A sequence's states are [head][piece]: each head's pieces are contiguous for the merge.
    const int64_t base = int64_t(sp.first_state) * h;
    for (int head = 0; head < h; ++head) {
      const int64_t slot = base + int64_t(head) * sp.pieces + w.index;
      state_m[slot] = a.m[head];
      state_l[slot] = a.l[head];
      std::copy(a.acc + int64_t(head) * d, a.acc + int64_t(head + 1) * d, state_acc + slot * d);
    }
    // The last piece merges (acq_rel: it sees every other piece's state).
    if (remaining[w.seq].fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (int head = 0; head < h; ++head) {
      const int64_t slot = base + int64_t(head) * sp.pieces;
      merge_and_write(p, w.seq, head, sp.pieces, state_m + slot, state_l + slot, state_acc + slot * d, d, a.acc);
    }
  });
}

}  // namespace vllm_metal::cpu
