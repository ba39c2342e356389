// eval_gpu of GdnShortConv and GdnGatedDelta (compiled on Apple only).
#include "metal/gdn_metal.h"

#include "dispatch/gdn_launch_plan.h"
#include "metal/launches.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

void gdn_short_conv_gpu(const mx::Stream& stream, const std::vector<mx::array>& inputs,
                        std::vector<mx::array>& outputs, int conv_offset) {
  auto& y = outputs[0];
  y.set_data(mx::allocator::malloc(y.nbytes()));
  outputs[1].copy_shared_buffer(inputs[2]);  // in place
  const auto& x = inputs[0];
  const auto& lo = inputs[2];
  dispatch::GdnProblem p;
  p.dtype = kernel_dtype(x.dtype());
  p.total_rows = x.shape(0);
  p.num_seqs = inputs[3].shape(0);
  p.num_blocks = lo.shape(0);
  p.lo_width = lo.shape(1);
  p.channels = x.shape(1);
  p.taps = inputs[1].shape(1);
  p.conv_offset = conv_offset;
  if (p.num_seqs == 0 || p.channels == 0) return;
  const dispatch::GdnPlan plan = dispatch::plan_gdn_short_conv(p);
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  for (size_t i = 0; i < plan.launches.size(); ++i) {
    // The state launch overwrites rows the row launch reads: a barrier between
    // them, whatever the encoder infers from the bindings.
    if (i > 0) enc.barrier();
    enc.set_compute_pipeline_state(pipeline(device, plan.launches[i]));
    enc.set_input_array(x, 0);
    enc.set_input_array(inputs[1], 1);
    enc.set_output_array(outputs[1], 2);
    for (int b = 3; b < 6; ++b) enc.set_input_array(inputs[b], b);
    enc.set_output_array(y, 6);
    enc.set_bytes(plan.params, 7);
    dispatch_launch(enc, plan.launches[i]);
  }
}

void gdn_gated_delta_gpu(const mx::Stream& stream, const std::vector<mx::array>& inputs,
                         std::vector<mx::array>& outputs, int ssm_offset, int heads_in_lo,
                         bool delta_rule, int chunk) {
  auto& y = outputs[0];
  y.set_data(mx::allocator::malloc(y.nbytes()));
  outputs[1].copy_shared_buffer(inputs[5]);  // in place
  outputs[2].copy_shared_buffer(inputs[6]);
  const auto& q = inputs[0];
  const auto& v = inputs[2];
  dispatch::GdnProblem p;
  p.dtype = kernel_dtype(q.dtype());
  p.total_rows = q.shape(0);
  p.num_seqs = inputs[7].shape(0);
  p.num_blocks = inputs[5].shape(0);
  p.lo_width = inputs[5].shape(1);
  p.hi_width = inputs[6].shape(1);
  p.num_k_heads = q.shape(1);
  p.num_v_heads = v.shape(1);
  p.head_k_dim = q.shape(2);
  p.head_v_dim = v.shape(2);
  p.ssm_offset = ssm_offset;
  p.heads_in_lo = heads_in_lo;
  p.vector_gate = inputs[3].ndim() == 3;
  p.delta_rule = delta_rule;
  p.chunk = chunk;  // the plan runs the chunked kernel for chunk > 0 and scalar gates
  if (p.num_seqs == 0 || p.head_v_dim == 0) return;
  const dispatch::GdnPlan plan = dispatch::plan_gdn_gated_delta(p);
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  // The recurrent and the chunked kernel bind the same buffers; the chunked one
  // declares its threadgroup memory in the shader, so nothing else is set.
  for (const auto& launch : plan.launches) {
    enc.set_compute_pipeline_state(pipeline(device, launch));
    for (int b = 0; b < 5; ++b) enc.set_input_array(inputs[b], b);
    enc.set_output_array(outputs[1], 5);
    enc.set_output_array(outputs[2], 6);
    for (int b = 7; b < 10; ++b) enc.set_input_array(inputs[b], b);
    enc.set_output_array(y, 10);
    enc.set_bytes(plan.params, 11);
    dispatch_launch(enc, launch);
  }
}

}  // namespace vllm_metal::metal
