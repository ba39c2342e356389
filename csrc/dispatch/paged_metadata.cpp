#include "dispatch/paged_metadata.h"

#include <stdexcept>
#include <string>

namespace vllm_metal::dispatch {

void check_paged_metadata(const PagedMetadata& m) {
  const int32_t* cu = m.cu_seqlens_q;
  if (cu[0] != 0) {
    throw std::invalid_argument("paged_attention: cu_seqlens_q[0] must be 0, got " + std::to_string(cu[0]));
  }
  if (cu[m.num_seqs] != m.total_q) {
    throw std::invalid_argument("paged_attention: cu_seqlens_q[-1] must equal query.shape[0] = " +
                                std::to_string(m.total_q) + ", got " + std::to_string(cu[m.num_seqs]));
  }
  for (int s = 0; s < m.num_seqs; ++s) {
    const int q_len = cu[s + 1] - cu[s];
    if (q_len < 0) {
      throw std::invalid_argument("paged_attention: cu_seqlens_q must be non-decreasing (index " +
                                  std::to_string(s) + ")");
    }
    const int ctx = m.seq_lens[s];
    if (ctx < q_len) {
      throw std::invalid_argument("paged_attention: seq_lens[" + std::to_string(s) + "] = " + std::to_string(ctx) +
                                  " is smaller than its " + std::to_string(q_len) + " query tokens");
    }
    if (ctx > m.capacity) {
      throw std::invalid_argument("paged_attention: seq_lens[" + std::to_string(s) + "] = " + std::to_string(ctx) +
                                  " exceeds block_tables capacity " + std::to_string(m.capacity) +
                                  " (max_blocks * block_size)");
    }
  }
}

}  // namespace vllm_metal::dispatch
