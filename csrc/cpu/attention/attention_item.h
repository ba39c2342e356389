// One work item of CPU paged attention: a chunk of query rows of one sequence,
// all heads, over one range of key positions.
//
// The item gathers K/V pages tile by tile into fp32 scratch: whole token rows
// (all KV heads), so the cache is read as contiguous runs the prefetchers can
// stream, and fp16/bf16 are decoded once per tile and shared by every query
// head of each GQA group. It keeps an online softmax in log2 space. It returns the unnormalized state
// (running max m, exp-sum l, weighted value sum acc) so a caller can either
// normalize directly or merge several key ranges (split-KV).
#pragma once

#include <cstdint>

#include "kv_quant.h"
#include "mlx/dtype.h"

namespace vllm_metal::cpu {

struct AttentionItem {
  // Cache [num_blocks, block_size, num_kv_heads, head_size], row-contiguous
  // (quantized: head_size + kKvScaleBytes bytes per head row, kv_quant.h).
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_table; // this sequence's row of block_tables
  // Float caches, pieces kernel only: key pages as columns, [num_blocks,
  // num_kv_heads, head_size, block_size] (value pages stay rows).
  bool key_columns = false;
  int num_blocks;
  int block_size;
  int num_kv_heads;
  int head_size;

  // Query vectors [rows, num_kv_heads * group, head_size] in fp32, already
  // multiplied by scale * log2(e) (or by scale alone when softcap > 0).
  const float* q;
  int rows;
  int group; // query heads per KV head
  // Row r attends key positions [row_lo[r], row_hi[r]); empty if lo >= hi.
  const int32_t* row_lo;
  const int32_t* row_hi;
  float softcap; // > 0: s = softcap * tanh(s / softcap), in natural units

  // Outputs per query vector i = r * num_heads + head, log2 domain:
  // m[i] running max, l[i] sum of 2^(s - m), acc[i * head_size + :] sum of
  // 2^(s - m) * v. Rows with nothing to attend keep m = -inf, l = 0, acc = 0.
  float* m;
  float* l;
  float* acc;

  // Scratch: k_tile and v_tile [num_kv_heads, tile, head_size], scores
  // [tile rounded up to a multiple of 16].
  float* k_tile;
  float* v_tile;
  float* scores;
  int tile; // keys per tile

  // The pieces kernel (select_pieces_item) only: the item's keys [key_lo,
  // key_hi) and the piece size; m, l and acc then hold one state per piece
  // (m[p * nq + i], ...), and the tile and scores scratch is unused.
  int key_lo = 0;
  int key_hi = 0;
  int piece = 0;
  // Optional: each piece folded into these nq states as it ends (m, l, acc then
  // hold one piece's states).
  float* fold_m = nullptr;
  float* fold_l = nullptr;
  float* fold_acc = nullptr;
};

// (m, l, acc[0:d]) <- the softmax state of itself and (m2, l2, acc2), log2
// domain. One out-of-line definition, so every fold of a call (in a kernel or
// in a merge) is the same arithmetic.
void fold_state(float& m, float& l, float* acc, float m2, float l2, const float* acc2, int d);

using AttentionItemFn = void (*)(const AttentionItem&);

// Keys per tile: fp32 K and V tiles stay within about 256 KiB (L2).
int attention_tile_keys(int num_kv_heads, int head_size);

// The kernel for this cache dtype and head size on the active ISA.
AttentionItemFn select_attention_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size);

// The portable single-row kernel (rows == 1: a decode step), same outputs as
// the tile kernel: it walks the keys page run by page run with the next run
// prefetched, and every query head of a group reads each K/V row while it is
// in L1 (fp16 / bf16 runs decoded into the tiles). Where select_pieces_item has
// a kernel, the pieces plan runs every call and this one is not used.
AttentionItemFn select_decode_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size);

// The pieces kernel (decode_row.inc): any number of query rows of one
// sequence, one state per piece of keys (see AttentionItem), each row's
// arithmetic independent of the item that holds it: what makes attention
// batch-invariant (paged_pieces_cpu.h). nullptr for head sizes other than
// 64, 128 and 256.
AttentionItemFn select_pieces_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size);

} // namespace vllm_metal::cpu
