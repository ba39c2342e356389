// eval_gpu of ExpertMatmul (compiled on Apple only).
#include "metal/experts_metal.h"

#include "dispatch/experts_launch_plan.h"
#include "metal/launches.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

void experts_gpu(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    int bits,
    int group_size,
    bool mxfp4,
    bool has_bias) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  if (out.size() == 0) return;
  const auto& x = inputs[0];
  const auto& w = inputs[2];
  dispatch::ExpertProblem problem;
  problem.dtype = kernel_dtype(out.dtype());
  problem.bits = bits;
  problem.rows = x.shape(0);
  problem.pairs = inputs[1].shape(0);
  problem.in_features = x.shape(1);
  problem.out_features = w.shape(1);
  problem.experts = w.shape(0);
  problem.group_size = group_size;
  problem.has_bias = has_bias;
  problem.mxfp4 = mxfp4;
  const dispatch::ExpertPlan plan = dispatch::plan_experts(problem);

  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  const int scales = bits != 0 ? 3 : -1;
  const int biases = bits != 0 && !mxfp4 ? 4 : -1;
  const int bias = has_bias ? 3 + (scales >= 0) + (biases >= 0) : -1;
  const mx::array& order = inputs.back();
  enc.set_compute_pipeline_state(pipeline(device, plan.launch));
  enc.set_input_array(x, 0);
  enc.set_input_array(inputs[1], 1);
  enc.set_input_array(order, 2);
  enc.set_input_array(w, 3);
  // Unread slots are bound to arrays at hand: the kernel never reads them.
  enc.set_input_array(scales >= 0 ? inputs[scales] : x, 4);
  enc.set_input_array(biases >= 0 ? inputs[biases] : x, 5);
  enc.set_input_array(bias >= 0 ? inputs[bias] : x, 6);
  enc.set_output_array(out, 7);
  enc.set_bytes(plan.params, 8);
  dispatch_launch(enc, plan.launch);
}

}  // namespace vllm_metal::metal
