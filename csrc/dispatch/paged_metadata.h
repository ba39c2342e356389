// The paged-attention metadata values the kernels trust: cu_seqlens_q starts
// at 0, ends at the query's row count and never decreases, and each sequence's
// context holds its query rows and fits its block table. One check for both
// backends: the CPU kernels run it inside their task (where the values are
// computed); the Metal route runs it on the host when the values are known as
// the op is built (a GPU kernel cannot raise).
#pragma once

#include <cstdint>

namespace vllm_metal::dispatch {

struct PagedMetadata {
  const int32_t* cu_seqlens_q;  // [num_seqs + 1]
  const int32_t* seq_lens;      // [num_seqs]
  int num_seqs;
  int64_t total_q;   // query rows
  int64_t capacity;  // keys a block table holds: max_blocks_per_seq * block_size
};

// Throws std::invalid_argument naming the first inconsistency.
void check_paged_metadata(const PagedMetadata& m);

}  // namespace vllm_metal::dispatch
