// eval_gpu of LatentCacheWrite and MlaAttention (compiled on Apple only).
#include "metal/mla_metal.h"

#include "dispatch/mla_launch_plan.h"
#include "metal/launches.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

void latent_cache_write_gpu(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out) {
  out.copy_shared_buffer(inputs[2]);  // in place
  const auto& latent = inputs[0];
  const auto& cache = inputs[2];
  if (latent.shape(0) == 0) return;
  dispatch::MlaProblem p;
  p.dtype = kernel_dtype(cache.dtype());
  p.total_q = latent.shape(0);
  p.rank = latent.shape(1);
  p.rope_dim = inputs[1].shape(1);
  p.block_size = cache.shape(1);
  p.num_blocks = cache.shape(0);
  const dispatch::MlaPlan plan = dispatch::plan_latent_cache_write(p);
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  enc.set_compute_pipeline_state(pipeline(device, plan.launch));
  enc.set_input_array(latent, 0);
  enc.set_input_array(inputs[1], 1);
  enc.set_output_array(out, 2);
  enc.set_input_array(inputs[3], 3);
  enc.set_bytes(plan.params, 7);
  dispatch_launch(enc, plan.launch);
}

void mla_attention_gpu(const mx::Stream& stream, const std::vector<mx::array>& inputs, mx::array& out,
                       float scale) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  const auto& q = inputs[0];
  const auto& cache = inputs[2];
  if (out.size() == 0) return;
  dispatch::MlaProblem p;
  p.dtype = kernel_dtype(q.dtype());
  p.total_q = q.shape(0);
  p.num_seqs = inputs[4].shape(0);
  p.num_heads = q.shape(1);
  p.rank = q.shape(2);
  p.rope_dim = inputs[1].shape(2);
  p.block_size = cache.shape(1);
  p.num_blocks = cache.shape(0);
  p.max_blocks_per_seq = inputs[3].shape(1);
  p.scale = scale;
  const dispatch::MlaPlan plan = dispatch::plan_mla_attention(p);
  auto& device = mx::metal::device(stream.device);
  auto& enc = mx::metal::get_command_encoder(stream);
  enc.set_compute_pipeline_state(pipeline(device, plan.launch));
  for (int i = 0; i < 6; ++i) enc.set_input_array(inputs[i], i);
  enc.set_output_array(out, 6);
  enc.set_bytes(plan.params, 7);
  dispatch_launch(enc, plan.launch);
}

}  // namespace vllm_metal::metal
