#include "cpu/runtime/scratch.h"

#include <atomic>

namespace vllm_metal::cpu {
namespace {
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
}  // namespace

void scratch_count(int64_t bytes) {
  const int64_t live = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak &&
         !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

std::pair<int64_t, int64_t> scratch_bytes(bool reset_peak) {
  if (reset_peak) g_peak.store(g_live.load(std::memory_order_relaxed));
  return {g_live.load(std::memory_order_relaxed), g_peak.load(std::memory_order_relaxed)};
}

}  // namespace vllm_metal::cpu
