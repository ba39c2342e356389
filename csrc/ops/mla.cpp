#include "ops/mla.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "cpu/mla/mla_cpu.h"
#include "cpu/runtime/strided_copy.h"
#include "dispatch/mla_launch_plan.h"
#include "metal/kernel_library.h"
#include "metal/mla_metal.h"
#include "mlx/backend/cpu/encoder.h"
#include "ops/cpu_inputs.h"
#include "ops/eval_layout.h"
#include "platform.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string(op) + ": " + msg);
}

mx::array as_int32(const mx::array& a, const mx::Stream& s) {
  return mx::contiguous(a.dtype() == mx::int32 ? a : mx::astype(a, mx::int32, s), false, s);
}

// The stream the op runs on: the GPU only with the kernels loaded, one dtype
// for the rows and the cache, and widths the kernels take.
mx::Stream stream_for(mx::StreamOrDevice s, mx::Dtype rows, const mx::array& cache, int rank, int rope) {
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu && metal::kernels_configured() &&
      rows == cache.dtype() && cache.flags().row_contiguous && dispatch::metal_supports_mla(rank, rope);
  return stream.device == mx::Device::gpu && !gpu ? mx::default_stream(mx::Device::cpu) : stream;
}

[[noreturn]] void no_gpu(const char* name) {
  throw std::runtime_error(std::string(name) + " has no GPU implementation on this platform; use the CPU stream.");
}

} // namespace

mx::array latent_cache_write(const mx::array& latent, const mx::array& k_pe, const mx::array& cache,
                             const mx::array& slot_mapping, mx::StreamOrDevice s) {
  const char* op = "latent_cache_write";
  if (latent.ndim() != 2 || !is_linear_float(latent.dtype())) fail(op, "latent must be float [T, rank]");
  if (k_pe.ndim() != 2 || k_pe.shape(0) != latent.shape(0) || k_pe.dtype() != latent.dtype()) {
    fail(op, "k_pe must be [T, rope_dim] with latent's T and dtype");
  }
  if (cache.ndim() != 3 || !is_linear_float(cache.dtype()) ||
      cache.shape(2) != latent.shape(1) + k_pe.shape(1)) {
    fail(op, "cache must be float [num_blocks, block_size, rank + rope_dim]");
  }
  if (slot_mapping.ndim() != 1 || slot_mapping.shape(0) != latent.shape(0) ||
      !mx::issubdtype(slot_mapping.dtype(), mx::integer)) {
    fail(op, "slot_mapping must be integer [T]");
  }
  auto stream = stream_for(s, latent.dtype(), cache, latent.shape(1), k_pe.shape(1));
  return mx::array(cache.shape(), cache.dtype(), std::make_shared<LatentCacheWrite>(stream),
                   {mx::contiguous(latent, false, stream), mx::contiguous(k_pe, false, stream),
                    cache, as_int32(slot_mapping, stream)});
}

void LatentCacheWrite::eval_cpu(const std::vector<mx::array>& inputs,
                                std::vector<mx::array>& outputs) {
  // The output aliases the cache's buffer: the write is in place.
  auto layout = alias_cache(inputs[2], outputs[0]);
  const auto& latent = inputs[0];
  cpu::LatentWriteArgs args{latent.data<void>(), inputs[1].data<void>(), elem_of(latent.dtype()),
                            inputs[3].data<int32_t>(), latent.shape(0),
                            static_cast<int>(latent.shape(1)), static_cast<int>(inputs[1].shape(1)),
                            outputs[0].data<void>(), elem_of(outputs[0].dtype()),
                            static_cast<int64_t>(inputs[2].shape(0)) * inputs[2].shape(1)};
  const char* src = inputs[2].data<char>();
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) encoder.set_input_array(in);
  encoder.set_output_array(outputs[0]);
  encoder.dispatch([args, layout, src]() {
    if (layout) cpu::copy_to_row_contiguous(src, *layout, static_cast<char*>(args.cache));
    cpu::latent_cache_write_cpu(args);
  });
}

mx::array mla_attention(const mx::array& q_latent, const mx::array& q_pe, const mx::array& cache,
                        const mx::array& block_tables, const mx::array& seq_lens,
                        const mx::array& cu_seqlens_q, float scale, mx::StreamOrDevice s) {
  const char* op = "mla_attention";
  if (q_latent.ndim() != 3 || !is_linear_float(q_latent.dtype())) {
    fail(op, "q_latent must be float [T, H, rank]");
  }
  if (q_pe.ndim() != 3 || q_pe.shape(0) != q_latent.shape(0) || q_pe.shape(1) != q_latent.shape(1) ||
      q_pe.dtype() != q_latent.dtype()) {
    fail(op, "q_pe must be [T, H, rope_dim] with q_latent's T, H and dtype");
  }
  if (cache.ndim() != 3 || !is_linear_float(cache.dtype()) ||
      cache.shape(2) != q_latent.shape(2) + q_pe.shape(2)) {
    fail(op, "cache must be float [num_blocks, block_size, rank + rope_dim]");
  }
  if (block_tables.ndim() != 2 || seq_lens.ndim() != 1 || cu_seqlens_q.ndim() != 1 ||
      block_tables.shape(0) != seq_lens.shape(0) || cu_seqlens_q.shape(0) != seq_lens.shape(0) + 1) {
    fail(op, "block_tables [S, max_blocks], seq_lens [S] and cu_seqlens_q [S + 1] disagree");
  }
  for (const auto* a : {&block_tables, &seq_lens, &cu_seqlens_q}) {
    if (!mx::issubdtype(a->dtype(), mx::integer)) fail(op, "the metadata must be integer arrays");
  }
  if (!std::isfinite(scale)) fail(op, "scale must be finite");
  auto stream = stream_for(s, q_latent.dtype(), cache, q_latent.shape(2), q_pe.shape(2));
  const bool gpu = stream.device == mx::Device::gpu;
  auto rows = [&](const mx::array& a) { return gpu ? mx::contiguous(a, false, stream) : a; };
  return mx::array(q_latent.shape(), q_latent.dtype(), std::make_shared<MlaAttention>(stream, scale),
                   {rows(q_latent), rows(q_pe), cache, as_int32(block_tables, stream),
                    as_int32(seq_lens, stream), as_int32(cu_seqlens_q, stream)});
}

void MlaAttention::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const float scale = scale_;
  const mx::Dtype out_type = outputs[0].dtype();
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [scale, out_type](const std::vector<RowContiguous>& in, void* dst) {
    const auto& q = in[0].view;
    const auto& cache = in[2].view;
    const auto& tables = in[3].view;
    cpu::MlaAttentionArgs a{};
    a.q_latent = q.data<void>();
    a.q_pe = in[1].view.data<void>();
    a.q_type = elem_of(q.dtype());
    a.cache = cache.data<void>();
    a.cache_type = elem_of(cache.dtype());
    a.block_tables = tables.data<int32_t>();
    a.max_blocks_per_seq = tables.shape(1);
    a.seq_lens = in[4].view.data<int32_t>();
    a.cu_seqlens_q = in[5].view.data<int32_t>();
    a.num_seqs = tables.shape(0);
    a.total_q = q.shape(0);
    a.num_heads = q.shape(1);
    a.rank = q.shape(2);
    a.rope_dim = in[1].view.shape(2);
    a.block_size = cache.shape(1);
    a.num_blocks = cache.shape(0);
    a.scale = scale;
    a.out = dst;
    a.out_type = elem_of(out_type);
    cpu::mla_attention_cpu(a);
  });
}

void LatentCacheWrite::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  require_row_contiguous("latent_cache_write", inputs, {"latent", "k_pe", "cache", "slot_mapping"});
  metal::latent_cache_write_gpu(stream(), inputs, outputs[0]);
#else
  (void)inputs;
  (void)outputs;
  no_gpu(name());
#endif
}

void MlaAttention::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  require_row_contiguous("mla_attention", inputs,
                         {"q_latent", "q_pe", "cache", "block_tables", "seq_lens", "cu_seqlens_q"});
  metal::mla_attention_gpu(stream(), inputs, outputs[0], scale_);
#else
  (void)inputs;
  (void)outputs;
  no_gpu(name());
#endif
}

} // namespace vllm_metal
