// Parameter block of the Gated DeltaNet kernels (gdn_short_conv, gdn_conv_state,
// gdn_gated_delta, gdn_gated_delta_chunked), shared verbatim by the Metal
// sources and the host that encodes them. Packed 4-byte scalars: Metal and C++
// lay them out alike.
#pragma once

#ifndef __METAL_VERSION__
namespace vllm_metal::kernels {
#endif

struct GdnParams {
  int total_rows;   // T: packed rows of the step
  int num_seqs;     // N: requests (slots, has_state [N]; cu_seqlens [N + 1])
  int num_blocks;   // rows of the pages
  int lo_width;     // floats per block of lo
  int hi_width;     // floats per block of hi (gated delta)
  int channels;     // C (short conv)
  int taps;         // K: the conv's taps
  int conv_offset;  // lo column of the conv state
  int num_k_heads;  // Hk (gated delta)
  int num_v_heads;  // Hv, a multiple of Hk
  int head_k_dim;   // Dk, a multiple of 32, at most 32 * kGdnKeysPerLane
  int head_v_dim;   // Dv
  int ssm_offset;   // lo column of head 0's state
  int heads_in_lo;  // heads whose state is in lo; the rest are in hi from column 0
  int vector_gate;  // 1: g is [T, Hv, Dk]; 0: [T, Hv]
  int delta_rule;   // 1: S += outer(beta (v - S k), k); 0: S += beta outer(v, k) (Mamba2)
  int chunk;        // gdn_gated_delta_chunked: rows per chunk, 1 .. kGdnChunkMax; else 0
};

#ifndef __METAL_VERSION__
}  // namespace vllm_metal::kernels
#endif
