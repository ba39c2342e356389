// The data checks both Gated DeltaNet ops make before they write a page.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/gdn/gdn_cpu.h"

namespace vllm_metal::cpu {

void check_gdn_batch(const char* op, const GdnBatch& b) {
  const std::string name(op);
  if (b.cu_seqlens[0] != 0 || b.cu_seqlens[b.num_seqs] != b.total_rows) {
    throw std::invalid_argument(name + ": cu_seqlens must start at 0 and end at the " +
                                std::to_string(b.total_rows) + " rows");
  }
  for (int n = 0; n < b.num_seqs; ++n) {
    if (b.cu_seqlens[n + 1] < b.cu_seqlens[n]) {
      throw std::invalid_argument(name + ": cu_seqlens must not decrease");
    }
    if (b.slots[n] < 0 || b.slots[n] >= b.num_blocks) {
      throw std::out_of_range(name + ": slot " + std::to_string(b.slots[n]) + " of request " +
                              std::to_string(n) + " is outside [0, " +
                              std::to_string(b.num_blocks) + ")");
    }
  }
  // Two requests in one block would race on its state.
  std::vector<int32_t> sorted(b.slots, b.slots + b.num_seqs);
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    throw std::invalid_argument(name + ": slot " + std::to_string(*twice) +
                                " is named by two requests");
  }
}

} // namespace vllm_metal::cpu
