// The Metal launches of the LoRA op: kernel names (built exactly as
// kernels_v2/lora.metal instantiates them), grids, threadgroup sizes and the
// parameter block. Pure, so Linux tests run on the MSL harness the same plan
// eval_gpu encodes on a Mac.
#pragma once

#include <cstdint>
#include <string>

#include "dispatch/metal_launch_plan.h"
#include "lora_params.h"

namespace vllm_metal::dispatch {

struct LoraProblem {
  KernelDtype dtype = KernelDtype::Float32;  // of x, A, B, y and out
  int rows = 0;
  int in_features = 0;
  int out_features = 0;
  int rank = 0;
  int num_slots = 0;
  bool add = false;       // out = y + update (lora_apply), else the update alone
  int out_cols = 0;       // columns of y and out (out_features without y)
  int column_offset = 0;  // out column of update column 0
  bool in_place = false;  // out shares y's buffer: only the segment's columns are written
};

struct LoraPlan {
  KernelLaunch shrink;
  KernelLaunch expand;
  kernels::LoraParams params;
  int64_t u_floats = 0;  // the fp32 buffer between them: rows x rank
};

std::string lora_shrink_kernel_name(KernelDtype dtype);
std::string lora_expand_kernel_name(KernelDtype dtype, bool add);

// Threads per threadgroup of the expand launch (one output column each).
inline constexpr uint32_t kLoraExpandThreads = 128;

// Throws std::invalid_argument for an inconsistent problem.
LoraPlan plan_lora(const LoraProblem& problem);

}  // namespace vllm_metal::dispatch
