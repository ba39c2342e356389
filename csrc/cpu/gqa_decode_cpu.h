// The CPU side of the GqaDecode route: one query row per sequence, one work
// item per (sequence, partition). An item decodes each K/V page row of its
// partition once into fp32 tiles (all KV heads of a token in one contiguous
// read) and every query head of each GQA group reuses them, as the Metal
// kernel's simdgroups share their KV head's reads; long contexts spread over
// all threads.
#pragma once

#include "cpu/paged_attention_cpu.h"
#include "cpu/thread_pool.h"

namespace vllm_metal::cpu {

// Partition z covers keys [z * partition_size, (z + 1) * partition_size) of
// each sequence's window (the Metal kernel's partitions); with
// num_partitions > 1 the partitions' softmax states are merged afterwards.
// Requires total_q == num_seqs (checked).
void gqa_decode_cpu(const PagedAttentionArgs& args, int partition_size, int num_partitions, ThreadPool& pool);

}  // namespace vllm_metal::cpu
