// eval_gpu bodies of the primitives (Apple only): encode the kernels_v2 launches
// planned by dispatch/metal_launch_plan.h through MLX's Metal command encoder.
#pragma once

#include "platform.h"

#if VLLM_METAL_APPLE()

#include <vector>

#include "dispatch/metal_launch_plan.h"
#include "mlx/array.h"
#include "mlx/stream.h"

namespace vllm_metal::metal {

// inputs: query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q[, sinks]
void paged_attention_gpu(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    mlx::core::array& out,
    const dispatch::PagedProblem& problem,
    const dispatch::PagedDispatch& decision,
    const dispatch::PagedAttentionFeatures& features);

// inputs: key, value, key_cache, value_cache, slot_mapping; outputs alias the caches.
// kv_quant > 0: the caches hold codes and scales (csrc/kv_quant.h).
void reshape_and_cache_gpu(
    const mlx::core::Stream& stream,
    const std::vector<mlx::core::array>& inputs,
    std::vector<mlx::core::array>& outputs,
    int kv_quant);

}  // namespace vllm_metal::metal

#endif
