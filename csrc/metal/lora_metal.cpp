// eval_gpu of LoraMatmul (compiled on Apple only).
#include "metal/lora_metal.h"

#include <algorithm>
#include <cstdint>

#include "dispatch/lora_launch_plan.h"
#include "metal/launches.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

void lora_gpu(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    mx::array& out,
    bool add,
    int column_offset,
    bool in_place) {
  if (in_place) {
    out.copy_shared_buffer(inputs[5]);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  const auto& x = inputs[0];
  const auto& lora_a = inputs[2];
  dispatch::LoraProblem problem;
  problem.dtype = kernel_dtype(x.dtype());
  problem.rows = static_cast<int>(inputs[1].size());
  problem.in_features = lora_a.shape(2);
  problem.out_features = inputs[3].shape(2);
  problem.rank = lora_a.shape(1);
  problem.num_slots = lora_a.shape(0);
  problem.add = add;
  problem.out_cols = out.shape(-1);
  problem.column_offset = column_offset;
  problem.in_place = in_place;
  if (problem.rows == 0 || out.size() == 0 || (in_place && problem.out_features == 0)) return;
  const dispatch::LoraPlan plan = dispatch::plan_lora(problem);

  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  mx::array u({static_cast<int>(std::max<int64_t>(plan.u_floats, 1))}, mx::float32, nullptr, {});
  u.set_data(mx::allocator::malloc(u.nbytes()));
  enc.add_temporary(u);

  enc.set_compute_pipeline_state(pipeline(device, plan.shrink));
  enc.set_input_array(x, 0);
  enc.set_input_array(inputs[1], 1);
  enc.set_input_array(lora_a, 2);
  enc.set_input_array(inputs[4], 3);
  enc.set_output_array(u, 4);
  enc.set_bytes(plan.params, 5);
  dispatch_launch(enc, plan.shrink);

  // Without y the kernel never reads buffer(7), but it must be bound: out stands in.
  enc.set_compute_pipeline_state(pipeline(device, plan.expand));
  enc.set_input_array(inputs[1], 1);
  enc.set_input_array(u, 4);
  enc.set_bytes(plan.params, 5);
  enc.set_input_array(inputs[3], 6);
  enc.set_input_array(add ? inputs[5] : out, 7);
  enc.set_output_array(out, 8);
  dispatch_launch(enc, plan.expand);
}

}  // namespace vllm_metal::metal
