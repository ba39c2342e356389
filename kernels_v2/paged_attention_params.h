// Parameter block of the paged-attention kernels, shared verbatim by the Metal
// sources and the host that encodes them (set as bytes at buffer(10)).
#pragma once

#ifndef __METAL_VERSION__
namespace vllm_metal::kernels {
#endif

struct PagedAttentionParams {
  int num_seqs;            // rows of block_tables, entries of seq_lens
  int num_heads;           // query heads
  int num_kv_heads;        // KV heads; num_heads is a multiple
  int max_blocks_per_seq;  // row stride of block_tables
  int partition_size;      // keys per split-KV partition (used with write_partials)
  int num_partitions;      // partitions per (query row, head) in the scratch buffers
  int sliding_window;      // keep the last W positions (used with use_sliding_window)
  float scale;             // softmax scale, natural-log units
  float softcap;           // c in c * tanh(s / c) (used with use_softcap)
  int use_key_ends;        // 1: buffer(11) holds each query row's key end (varlen)
};

struct ReshapeAndCacheParams {
  int row_elems;  // num_kv_heads * head_size
  int num_slots;  // num_blocks * block_size
  int head_size;  // quantized caches: elements per head row (else unused)
};

#ifndef __METAL_VERSION__
}  // namespace vllm_metal::kernels
#endif
