// eval_gpu of PagedAttention and ReshapeAndCache (compiled on Apple only).
#include "metal/metal_ops.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "metal/launches.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

namespace {

mx::array scratch(mx::metal::CommandEncoder& enc, int64_t floats) {
  mx::array a({static_cast<int>(std::max<int64_t>(floats, 1))}, mx::float32, nullptr, {});
  a.set_data(mx::allocator::malloc(a.nbytes()));
  enc.add_temporary(a);
  return a;
}

}  // namespace

void paged_attention_gpu(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    const dispatch::PagedProblem& problem,
    const dispatch::PagedDispatch& decision,
    const dispatch::PagedAttentionFeatures& features) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  const dispatch::PagedAttentionPlan plan = dispatch::plan_paged_attention(problem, decision, features);
  const int64_t head_size = problem.head_size;
  mx::array stats = scratch(enc, plan.partial_rows * problem.num_heads * plan.num_partitions * 2);
  mx::array partials = scratch(enc, plan.partial_rows * problem.num_heads * plan.num_partitions * head_size);
  // Without sinks (key ends) the kernels never read buffer(6) (11), but it must be
  // bound: seq_lens stands in.
  const mx::array& sinks = features.has_sinks ? inputs[6] : inputs[4];
  const mx::array& key_ends = features.has_key_ends ? inputs.back() : inputs[4];
  for (const auto& launch : plan.launches) {
    enc.set_compute_pipeline_state(pipeline(device, launch));
    enc.set_input_array(inputs[0], 0);
    enc.set_input_array(inputs[1], 1);
    enc.set_input_array(inputs[2], 2);
    enc.set_input_array(inputs[3], 3);
    enc.set_input_array(inputs[4], 4);
    enc.set_input_array(inputs[5], 5);
    enc.set_input_array(sinks, 6);
    enc.set_output_array(out, 7);
    enc.set_output_array(stats, 8);
    enc.set_output_array(partials, 9);
    enc.set_bytes(plan.params, 10);
    enc.set_input_array(key_ends, 11);
    dispatch_launch(enc, launch);
  }
}

void reshape_and_cache_gpu(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs,
    int kv_quant) {
  // The outputs are the caches themselves (row-contiguous: checked by eval_gpu).
  outputs[0].copy_shared_buffer(inputs[2]);
  outputs[1].copy_shared_buffer(inputs[3]);
  const int num_tokens = inputs[0].shape(0);
  if (num_tokens == 0) return;
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  const int row = inputs[0].shape(1) * inputs[0].shape(2);
  const int num_slots = inputs[2].shape(0) * inputs[2].shape(1);
  // The rows' dtype: the cache's, or for a quantized cache (bytes) the input's.
  const auto dtype = kernel_dtype(inputs[0].dtype());
  const dispatch::ReshapeAndCachePlan plan =
      dispatch::plan_reshape_and_cache(dtype, num_tokens, row, num_slots, kv_quant, inputs[0].shape(2));
  enc.set_compute_pipeline_state(pipeline(device, plan.launch));
  enc.set_input_array(inputs[0], 0);
  enc.set_input_array(inputs[1], 1);
  enc.set_output_array(outputs[0], 2);
  enc.set_output_array(outputs[1], 3);
  enc.set_input_array(inputs[4], 4);
  enc.set_bytes(plan.params, 5);
  dispatch_launch(enc, plan.launch);
}

}  // namespace vllm_metal::metal
