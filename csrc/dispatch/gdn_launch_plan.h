// The Metal launches of the Gated DeltaNet ops: kernel names (built exactly as
// kernels_v2/gdn.metal instantiates them), grids, threadgroup sizes and the
// parameter block. Pure, so Linux tests run on the MSL harness the same plan
// eval_gpu encodes on a Mac.
#pragma once

#include <vector>

#include "dispatch/metal_launch_plan.h"
#include "gdn_params.h"

namespace vllm_metal::dispatch {

struct GdnProblem {
  KernelDtype dtype = KernelDtype::Float32;  // of x (or q, k, v) and the output
  int total_rows = 0;                        // T
  int num_seqs = 0;                          // N
  int num_blocks = 0;
  int lo_width = 0;
  int hi_width = 0;
  int channels = 0;                          // short conv: C
  int taps = 0;                              // short conv: K
  int conv_offset = 0;                       // short conv: lo column of its state
  int num_k_heads = 0;                       // gated delta: Hk, Hv, Dk, Dv
  int num_v_heads = 0;
  int head_k_dim = 0;
  int head_v_dim = 0;
  int ssm_offset = 0;
  int heads_in_lo = 0;
  bool vector_gate = false;
  bool delta_rule = true;                    // false: gated linear attention (no - S k)
  int chunk = 0;                             // 0: token by token; C > 0: chunks of C rows
};

struct GdnPlan {
  // In order. The short conv's second launch overwrites state rows its first
  // reads: the encoder puts a barrier between them.
  std::vector<KernelLaunch> launches;
  kernels::GdnParams params;
};

// The gated delta kernel's key width: Dk a multiple of 32 up to 256
// (kGdnKeysPerLane in kernels_v2/gdn.h).
bool metal_supports_gdn(int head_k_dim);
// The chunked kernel's chunk sizes: 1 to 64 rows (kGdnChunkMax in
// kernels_v2/gdn_chunked.h, which sizes its threadgroup memory).
bool metal_supports_gdn_chunk(int chunk);

// Throw std::invalid_argument for an inconsistent or unsupported problem.
// The gated delta runs gdn_gated_delta_chunked when chunk > 0 and the gate is
// scalar, else the recurrence (gdn_gated_delta, which ignores chunk).
GdnPlan plan_gdn_short_conv(const GdnProblem& problem);
GdnPlan plan_gdn_gated_delta(const GdnProblem& problem);

}  // namespace vllm_metal::dispatch
