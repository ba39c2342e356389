// The CPU side of the GqaDecode route: one query row per sequence. Each
// sequence's keys (its sliding window, if any) are cut into equal pieces of at
// most `partition_size` keys; a work item is one (sequence, piece) and runs
// the single-row kernel (attention_item.h: every query head of a GQA group
// reads each K/V row while it is in L1, the next page is prefetched). The
// last piece of a sequence to finish merges the pieces' softmax states and
// writes the output, so the call is one pass over the thread pool.
#pragma once

#include "cpu/attention/paged_attention_cpu.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu {

// Requires total_q == num_seqs and partition_size >= 1 (checked).
void gqa_decode_cpu(const PagedAttentionArgs& args, int partition_size, ThreadPool& pool);

}  // namespace vllm_metal::cpu
