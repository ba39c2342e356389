// eval_gpu bodies of the MLA ops (Apple only): encode the kernels_v2/mla.metal
// launches planned by dispatch/mla_launch_plan.h through MLX's command encoder.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace vllm_metal::metal {

// inputs: latent, k_pe, cache, slot_mapping (int32); out shares the cache's buffer.
void latent_cache_write_gpu(const mlx::core::Stream& stream, const std::vector<mlx::core::array>& inputs,
                            mlx::core::array& out);

// inputs: q_latent, q_pe, cache, block_tables, seq_lens, cu_seqlens_q (int32).
void mla_attention_gpu(const mlx::core::Stream& stream, const std::vector<mlx::core::array>& inputs,
                       mlx::core::array& out, float scale);

}  // namespace vllm_metal::metal

#endif
