// eval_gpu bodies of the Gated DeltaNet ops (Apple only): encode the
// kernels_v2/gdn.metal launches planned by dispatch/gdn_launch_plan.h through
// MLX's command encoder.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace vllm_metal::metal {

// inputs: x, weight (float32), lo, slots, cu_seqlens, has_state (int32);
// outputs: y, lo (sharing the input pages' buffer).
void gdn_short_conv_gpu(const mlx::core::Stream& stream, const std::vector<mlx::core::array>& inputs,
                        std::vector<mlx::core::array>& outputs, int conv_offset);

// inputs: q, k, v, g, beta (float32), lo, hi, slots, cu_seqlens, has_state (int32);
// outputs: y, lo, hi (sharing the input pages' buffers).
void gdn_gated_delta_gpu(const mlx::core::Stream& stream, const std::vector<mlx::core::array>& inputs,
                         std::vector<mlx::core::array>& outputs, int ssm_offset, int heads_in_lo,
                         bool delta_rule, int chunk);

}  // namespace vllm_metal::metal

#endif
