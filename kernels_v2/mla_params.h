// Parameter block of the MLA kernels (latent_cache_write, mla_attention), shared
// verbatim by the Metal sources and the host that encodes them. Packed 4-byte
// scalars: Metal and C++ lay them out alike.
#pragma once

#ifndef __METAL_VERSION__
namespace vllm_metal::kernels {
#endif

struct MlaParams {
  int total_q;             // T: query rows (attention) or tokens written (cache write)
  int num_seqs;            // S
  int num_heads;           // H
  int rank;                // latent width, a multiple of 32, at most 32 * kMlaRankPerLane
  int rope_dim;            // positional key width
  int block_size;
  int num_blocks;
  int max_blocks_per_seq;  // columns of block_tables
  float scale;             // softmax scale
};

#ifndef __METAL_VERSION__
}  // namespace vllm_metal::kernels
#endif
