// Walking one sequence's keys through its block table, page run by page run:
// the bounds-checked block lookup and the prefetcher of the next run, shared
// by the CPU attention kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/attention/attention_item.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

// Throws std::out_of_range naming the bad block_tables entry.
[[noreturn]] void throw_bad_block(int32_t block, int logical_block, int num_blocks);

// The run of positions [t, t + n) of a's sequence that lies in one page, with
// n <= min(limit, end - t): returns n and sets *first_row to the element
// offset of the run's first cache row (all KV heads of a position are one row,
// `row` elements long).
VLLM_METAL_INLINE int page_run(const AttentionItem& a, int t, int end, int limit, int64_t row, int64_t* first_row) {
  const int bs = a.block_size;
  const int logical = t / bs;
  const int off = t - logical * bs;
  const int32_t block = a.block_table[logical];
  if (block < 0 || block >= a.num_blocks) throw_bad_block(block, logical, a.num_blocks);
  *first_row = (static_cast<int64_t>(block) * bs + off) * row;
  return std::min({bs - off, end - t, limit});
}

// Prefetches the K and V lines of the next page run into L2 a few at a time:
// the kernel ticks at evenly spaced points of its work on the current run.
// Pages sit in random order, so the hardware prefetcher cannot guess the next
// one; interleaved prefetches overlap with the loads in flight, while a burst
// of them stalls on the miss buffers (measured on random 12 KiB pages, one
// thread: 17 GB/s interleaved, 9-14 GB/s as bursts or without).
struct RunPrefetcher {
  const char* k = nullptr;
  const char* v = nullptr;
  int64_t lines = 0;
  int64_t next = 0;
  int64_t per_tick = 0;

  // The run's K and V rows start at k_run / v_run and span `bytes` each;
  // `ticks` calls of tick() will cover them.
  VLLM_METAL_INLINE void start(const void* k_run, const void* v_run, int64_t bytes, int64_t ticks) {
    k = static_cast<const char*>(k_run);
    v = static_cast<const char*>(v_run);
    lines = (bytes + 63) / 64;
    next = 0;
    per_tick = ticks > 0 ? (lines + ticks - 1) / ticks : lines;
  }
  VLLM_METAL_INLINE void tick() {
    const int64_t end = std::min(lines, next + per_tick);
    for (; next < end; ++next) {
      __builtin_prefetch(k + 64 * next, 0, 2);
      __builtin_prefetch(v + 64 * next, 0, 2);
    }
  }
};

} // namespace vllm_metal::cpu
