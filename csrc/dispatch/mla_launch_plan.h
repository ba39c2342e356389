// The Metal launches of the MLA ops: kernel names (built exactly as
// kernels_v2/mla.metal instantiates them), grids, threadgroup sizes and the
// parameter block. Pure, so Linux tests run on the MSL harness the same plan
// eval_gpu encodes on a Mac.
#pragma once

#include <string>

#include "dispatch/metal_launch_plan.h"
#include "mla_params.h"

namespace vllm_metal::dispatch {

struct MlaProblem {
  KernelDtype dtype = KernelDtype::Float32;  // of the queries (or latents), cache and output
  int total_q = 0;                           // query rows, or tokens written
  int num_seqs = 0;
  int num_heads = 0;
  int rank = 0;
  int rope_dim = 0;
  int block_size = 0;
  int num_blocks = 0;
  int max_blocks_per_seq = 0;
  float scale = 1.0f;
};

struct MlaPlan {
  KernelLaunch launch;
  kernels::MlaParams params;
};

// The kernels' widths: rank a multiple of 32 up to 512, rope_dim up to 128
// (kMlaRankPerLane, kMlaRopePerLane in kernels_v2/mla.h).
bool metal_supports_mla(int rank, int rope_dim);

// Throw std::invalid_argument for an inconsistent or unsupported problem.
MlaPlan plan_latent_cache_write(const MlaProblem& problem);
MlaPlan plan_mla_attention(const MlaProblem& problem);

}  // namespace vllm_metal::dispatch
