// eval_gpu body of the expert-matmul op (Apple only): encodes the
// kernels_v2/experts.metal launch planned by dispatch/experts_launch_plan.h
// through MLX's command encoder.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace vllm_metal::metal {

// inputs: x, idx, w[, scales[, biases]][, bias], order (idx's argsort), all
// row-contiguous; bits 0 for float w; mxfp4: no biases.
void experts_gpu(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    mlx::core::array& out,
    int bits,
    int group_size,
    bool mxfp4,
    bool has_bias);

}  // namespace vllm_metal::metal

#endif
