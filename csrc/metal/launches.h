// Encoding a planned launch (dispatch/*_launch_plan.h) through MLX's Metal
// command encoder: the pipeline from the configured kernels_v2 library the
// launch names (main or tensor-op; specialized by its function constants when
// the plan says so), and the dispatch. Apple only.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include "dispatch/metal_launch_plan.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

// The kernels' element type of an array dtype (Unsupported for others).
dispatch::KernelDtype kernel_dtype(mlx::core::Dtype t);

// The launch's pipeline, once the device confirms it can run its threadgroups.
MTL::ComputePipelineState* pipeline(mlx::core::metal::Device& device, const dispatch::KernelLaunch& launch);

void dispatch_launch(mlx::core::metal::CommandEncoder& enc, const dispatch::KernelLaunch& launch);

}  // namespace vllm_metal::metal

#endif
