// Batch-invariant CPU paged attention.
//
// Every query row's output is one fixed function of its query, its key range and
// the cache: its keys are cut into pieces of kPieceKeys at absolute multiples,
// each piece's softmax state is computed by the pieces kernel from an empty
// state (decode_row.inc: vectors at fixed positions, the row's own mask), and
// the states are folded left to right (fold_state) before the output is
// normalized. Which rows share an item, how a sequence's rows are chunked and
// how its keys are shared among threads change only who computes a piece, never
// its arithmetic: a greedy token does not depend on the batch around it, on
// chunked prefill, or on speculative verification rows.
#pragma once

#include "cpu/attention/paged_attention_cpu.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu {

// Keys per piece: a fold per 64 keys costs about 3% of the work, and short
// contexts still cut into enough pieces to share among threads.
inline constexpr int kPieceKeys = 64;
// Query rows per work item (the pieces kernel reads each K/V vector once for them).
inline constexpr int kPieceRows = 16;

// Runs the call through the pieces kernel when this ISA, cache dtype and head
// size have one, and returns false (having done nothing) otherwise. split_keys
// > 0 cuts each chunk of rows into about ceil(keys / split_keys) items of whole
// pieces, run in parallel (the route's partition size); 0: one item per chunk.
bool run_paged_pieces(const PagedAttentionArgs& p, int split_keys, ThreadPool& pool);

} // namespace vllm_metal::cpu
