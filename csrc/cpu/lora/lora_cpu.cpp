#include "cpu/lora/lora_cpu.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/lora/lora_kernels.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu {

namespace {

// Below this much data (the adapters in use and the rows they touch) one
// thread is faster than waking the pool. Low, because a decode step's adapters
// come cold from memory in small pieces (one projection's A and B), which one
// thread reads at well under the memory's bandwidth: two halve the wait. On a
// 2-core AVX2 host, one-row steps of SmolLM2 with rank-8/16 adapters on every
// projection spent 10-20% less in LoRA than with a 128 KiB threshold.
constexpr int64_t kSerialBytes = 16 * 1024;
// Rows of one adapter per shrink item: x rows and A rows meet in L1.
constexpr int64_t kShrinkItemRows = 16;
// A rows per shrink item come in multiples of this (the widest kernel tile).
constexpr int64_t kShrinkRankTile = 8;
// Work items per pool thread: a thread that finishes early takes another.
constexpr int64_t kItemsPerThread = 2;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t elem_bytes(Elem t) {
  return t == Elem::F32 ? 4 : 2;
}

int64_t b_ld(const LoraArgs& a) {
  return a.b_ld ? a.b_ld : a.out_features;
}

// Elements from one slot's B to the next.
int64_t b_slot_stride(const LoraArgs& a) {
  return a.rank * b_ld(a);
}

// The rows of one adapter slot: order[begin, end), also rows [begin, end) of u.
struct Group {
  int64_t slot, begin, end;
};

void check_types(const LoraArgs& a) {
  if (a.weight_type != a.type && a.type != Elem::F32) {
    throw std::invalid_argument("lora: half-precision adapters need float32 activations; "
                                "x, y and out must otherwise have the adapters' type");
  }
}

void check_idx(const LoraArgs& a) {
  for (int64_t t = 0; t < a.rows; ++t) {
    const int64_t v = a.idx[t];
    if (v < -1 || v >= a.num_slots) {
      throw std::out_of_range("lora: idx[" + std::to_string(t) + "] = " + std::to_string(v) +
                              " is outside [-1, " + std::to_string(a.num_slots) + "): " +
                              std::to_string(a.num_slots) + " adapter slots, -1 = no adapter");
    }
  }
}

// Rows grouped by slot (ascending), each group in step order: a counting sort,
// so each adapter's A and B are read once per step, by its group. The vectors
// are the calling thread's, kept between calls: a decode step calls this once
// per adapted projection, and allocating each time was a measurable share of it.
const std::vector<Group>& group_rows(const LoraArgs& a, int32_t* order) {
  thread_local std::vector<int64_t> start, next;
  thread_local std::vector<Group> groups;
  start.assign(a.num_slots + 1, 0);
  for (int64_t t = 0; t < a.rows; ++t) {
    if (a.idx[t] >= 0) ++start[a.idx[t] + 1];
  }
  for (int64_t s = 0; s < a.num_slots; ++s) start[s + 1] += start[s];
  next.assign(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < a.rows; ++t) {
    if (a.idx[t] >= 0) order[next[a.idx[t]]++] = static_cast<int32_t>(t);
  }
  groups.clear();
  for (int64_t s = 0; s < a.num_slots; ++s) {
    if (start[s + 1] > start[s]) groups.push_back({s, start[s], start[s + 1]});
  }
  return groups;
}

void run_items(int64_t items, bool parallel, const std::function<void(int64_t)>& fn) {
  if (!parallel || items <= 1) {
    for (int64_t i = 0; i < items; ++i) fn(i);
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(items), [&](int i) { fn(i); });
}

struct ShrinkItem {
  const Group* group;
  int64_t row0, row1, j0, j1;
};

// u[g.begin + i, j] for every group's rows: items of up to kShrinkItemRows rows
// and a block of A's rows, cut so every thread gets work even for one row.
void shrink_all(const LoraKernels& kern, const LoraArgs& a, const std::vector<Group>& groups,
                const int32_t* order, float* u, bool parallel, int threads) {
  const size_t wb = elem_bytes(a.weight_type);
  int64_t row_blocks = 0;
  for (const Group& g : groups) row_blocks += ceil_div(g.end - g.begin, kShrinkItemRows);
  // Blocks of whole 8-row kernel tiles of A (a lone row's tile).
  const int64_t splits = std::clamp<int64_t>(ceil_div(kItemsPerThread * threads, row_blocks), 1,
                                             ceil_div(a.rank, kShrinkRankTile));
  const int64_t rank_block = ceil_div(ceil_div(a.rank, splits), kShrinkRankTile) * kShrinkRankTile;
  // The caller's vector, kept between calls (see group_rows); a reference, which
  // the pool's lambda captures (a thread_local name would be each worker's own).
  thread_local std::vector<ShrinkItem> kept;
  std::vector<ShrinkItem>& items = kept;
  items.clear();
  for (const Group& g : groups) {
    for (int64_t r0 = g.begin; r0 < g.end; r0 += kShrinkItemRows) {
      for (int64_t j0 = 0; j0 < a.rank; j0 += rank_block) {
        items.push_back({&g, r0, std::min(g.end, r0 + kShrinkItemRows), j0, std::min(a.rank, j0 + rank_block)});
      }
    }
  }
  run_items(static_cast<int64_t>(items.size()), parallel, [&](int64_t i) {
    const ShrinkItem& it = items[i];
    const auto* slot_a = static_cast<const char*>(a.a) + it.group->slot * a.rank * a.in_features * wb;
    LoraShrink s;
    s.x = a.x;
    s.rows = {order + it.row0, it.row1 - it.row0};
    s.a = slot_a + it.j0 * a.in_features * wb;
    s.rank_rows = it.j1 - it.j0;
    s.in_features = a.in_features;
    s.scale = a.scale[it.group->slot];
    s.u = u + it.row0 * a.rank + it.j0;
    s.ldu = a.rank;
    s.type = a.type;
    s.weight_type = a.weight_type;
    kern.shrink(s);
  });
}

// Columns [c0, c1) of out for every row: y's own bits (or zeros) where there is
// no update, then each group's update in the segment's share of the columns.
void expand_columns(const LoraKernels& kern, const LoraArgs& a, const std::vector<Group>& groups,
                    const int32_t* order, const float* u, int64_t c0, int64_t c1) {
  const size_t eb = elem_bytes(a.type);
  char* out = static_cast<char*>(a.out);
  if (a.y != nullptr && !a.in_place) {
    const char* y = static_cast<const char*>(a.y);
    for (int64_t t = 0; t < a.rows; ++t) {
      std::memcpy(out + (t * a.out_cols + c0) * eb, y + (t * a.out_cols + c0) * eb, (c1 - c0) * eb);
    }
  } else if (a.y == nullptr) {
    for (int64_t t = 0; t < a.rows; ++t) {
      if (a.idx[t] < 0) std::memset(out + (t * a.out_cols + c0) * eb, 0, (c1 - c0) * eb);
    }
  }
  const int64_t s0 = std::max(c0, a.column_offset) - a.column_offset;
  const int64_t s1 = std::min(c1, a.column_offset + a.out_features) - a.column_offset;
  if (s0 >= s1 || groups.empty()) return;
  for (const Group& g : groups) {
    LoraExpand e;
    e.u = u + g.begin * a.rank;
    e.ldu = a.rank;
    e.rows = {order + g.begin, g.end - g.begin};
    e.b = static_cast<const char*>(a.b) + g.slot * b_slot_stride(a) * elem_bytes(a.weight_type);
    e.ldb = b_ld(a);
    e.rank = a.rank;
    e.c0 = s0;
    e.c1 = s1;
    e.y = a.y;
    e.out = a.out;
    e.ldo = a.out_cols;
    e.offset = a.column_offset;
    e.type = a.type;
    e.weight_type = a.weight_type;
    kern.expand(e);
  }
}

}  // namespace

void lora_cpu(const LoraArgs& a) {
  if (a.rows == 0) return;
  check_types(a);
  check_idx(a);
  const LoraKernels& kern = lora_kernels();
  ScratchArray<int32_t> order = scratch_array<int32_t>(a.rows);
  const std::vector<Group>& groups = group_rows(a, order.get());
  const int64_t adapted = groups.empty() ? 0 : groups.back().end;
  const int64_t bytes =
      static_cast<int64_t>(groups.size()) * a.rank * (a.in_features + a.out_features) * elem_bytes(a.weight_type) +
      a.rows * (a.in_features + a.out_cols) * elem_bytes(a.type);
  const bool parallel = bytes >= kSerialBytes && ThreadPool::instance().size() > 1;
  const int threads = parallel ? ThreadPool::instance().size() : 1;

  ScratchArray<float> u = scratch_array<float>(std::max<int64_t>(adapted * a.rank, 1));
  if (adapted > 0 && a.rank > 0) shrink_all(kern, a, groups, order.get(), u.get(), parallel, threads);

  // In place, only the segment changes; otherwise every column of out is written.
  const int64_t lo = a.in_place ? a.column_offset : 0;
  const int64_t hi = a.in_place ? a.column_offset + a.out_features : a.out_cols;
  if (hi <= lo || (a.in_place && adapted == 0)) return;
  const int64_t width = kern.width;
  const int64_t cols = std::max(width, ceil_div(ceil_div(hi - lo, kItemsPerThread * threads), width) * width);
  run_items(ceil_div(hi - lo, cols), parallel, [&](int64_t i) {
    expand_columns(kern, a, groups, order.get(), u.get(), lo + i * cols, std::min(hi, lo + (i + 1) * cols));
  });
}

}  // namespace vllm_metal::cpu
