// eval_gpu body of the LoRA op (Apple only): encodes the kernels_v2/lora.metal
// launches planned by dispatch/lora_launch_plan.h through MLX's command encoder.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace vllm_metal::metal {

// inputs: x, idx (int32), lora_a, lora_b, scale (float32)[, y], row-contiguous.
// in_place (add only): out takes y's buffer, and only the segment is written.
void lora_gpu(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    mlx::core::array& out,
    bool add,
    int column_offset,
    bool in_place);

}  // namespace vllm_metal::metal

#endif
