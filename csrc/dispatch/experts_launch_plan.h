// The Metal launch of the expert-matmul op: kernel name (built exactly as
// kernels_v2/experts.metal instantiates it), grid, threadgroup size and the
// parameter block. Pure, so Linux tests run on the MSL harness the same plan
// eval_gpu encodes on a Mac.
#pragma once

#include <string>

#include "dispatch/metal_launch_plan.h"
#include "experts_params.h"

namespace vllm_metal::dispatch {

struct ExpertProblem {
  KernelDtype dtype = KernelDtype::Float32;  // of x, float W or the scales, bias and out
  int bits = 0;                              // 0: float W; 4 or 8: MLX affine codes
  bool mxfp4 = false;                        // bits 4, group 32: FP4 codes, E8M0 scales
  int rows = 0;
  int pairs = 0;
  int in_features = 0;
  int out_features = 0;
  int experts = 0;
  int group_size = 0;
  bool has_bias = false;
};

struct ExpertPlan {
  KernelLaunch launch;
  kernels::ExpertParams params;
};

std::string experts_kernel_name(KernelDtype dtype, int bits, bool mxfp4);

// Throws std::invalid_argument for an inconsistent problem.
ExpertPlan plan_experts(const ExpertProblem& problem);

}  // namespace vllm_metal::dispatch
