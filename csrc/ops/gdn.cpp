#include "ops/gdn.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cpu/gdn/gdn_cpu.h"
#include "cpu/runtime/strided_copy.h"
#include "dispatch/gdn_launch_plan.h"
#include "metal/gdn_metal.h"
#include "metal/kernel_library.h"
#include "mlx/allocator.h"
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

void check_float(const char* op, const mx::array& a, const char* name, const char* shape) {
  if (!is_linear_float(a.dtype())) {
    fail(op, std::string(name) + " must be float16, bfloat16 or float32 " + shape);
  }
}

void check_pages(const char* op, const mx::array& pages, const char* name) {
  if (pages.ndim() != 2 || pages.dtype() != mx::float32) {
    fail(op, std::string(name) + " must be float32 [num_blocks, W]");
  }
}

void check_batch(const char* op, const mx::array& slots, const mx::array& cu_seqlens,
                 const mx::array& has_state) {
  if (slots.ndim() != 1 || !mx::issubdtype(slots.dtype(), mx::integer)) {
    fail(op, "slots must be integer [N]");
  }
  if (cu_seqlens.ndim() != 1 || cu_seqlens.shape(0) != slots.shape(0) + 1 ||
      !mx::issubdtype(cu_seqlens.dtype(), mx::integer)) {
    fail(op, "cu_seqlens must be integer [N + 1] (N = slots' length)");
  }
  if (has_state.ndim() != 1 || has_state.shape(0) != slots.shape(0) ||
      !(has_state.dtype() == mx::bool_ || mx::issubdtype(has_state.dtype(), mx::integer))) {
    fail(op, "has_state must be bool or integer [N] (N = slots' length)");
  }
}

// The stream the op runs on: the GPU only with the kernels loaded, pages that
// are row-contiguous, and inputs the kernels take (`fits`).
mx::Stream stream_for(mx::StreamOrDevice s, bool fits, const mx::array& lo, const mx::array& hi) {
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu && metal::kernels_configured() && fits &&
      lo.flags().row_contiguous && hi.flags().row_contiguous;
  return stream.device == mx::Device::gpu && !gpu ? mx::default_stream(mx::Device::cpu) : stream;
}

// The kernels read the float side inputs (conv taps, gate, beta) as float32:
// exact, and one instantiation per dtype of the rows.
mx::array side_input(const mx::array& a, const mx::Stream& s) {
  const bool gpu = s.device == mx::Device::gpu;
  return mx::contiguous(gpu && a.dtype() != mx::float32 ? mx::astype(a, mx::float32, s) : a,
                        false, s);
}

[[noreturn]] void no_gpu(const char* name) {
  throw std::runtime_error(std::string(name) +
                           " has no GPU implementation on this platform; use the CPU stream.");
}

cpu::GdnBatch batch_of(const std::vector<mx::array>& inputs, int first, int64_t rows,
                       int64_t num_blocks) {
  return {inputs[first].data<int32_t>(), inputs[first + 1].data<int32_t>(),
          inputs[first + 2].data<int32_t>(), static_cast<int>(inputs[first].shape(0)), rows,
          num_blocks};
}

} // namespace

std::pair<mx::array, mx::array> gdn_short_conv(const mx::array& x, const mx::array& weight,
                                               const mx::array& lo, const mx::array& slots,
                                               const mx::array& cu_seqlens,
                                               const mx::array& has_state, int conv_offset,
                                               mx::StreamOrDevice s) {
  const char* op = "gdn_short_conv";
  if (x.ndim() != 2) fail(op, "x must be [T, C]");
  check_float(op, x, "x", "[T, C]");
  if (weight.ndim() != 2 || weight.shape(0) != x.shape(1) || weight.shape(1) < 1) {
    fail(op, "weight must be [C, K] with x's C and K >= 1");
  }
  check_float(op, weight, "weight", "[C, K]");
  check_pages(op, lo, "lo");
  if (conv_offset < 0) fail(op, "conv_offset must be >= 0");
  const int64_t conv_floats = static_cast<int64_t>(weight.shape(1) - 1) * x.shape(1);
  if (conv_offset + conv_floats > lo.shape(1)) {
    fail(op, "lo's rows of W = " + std::to_string(lo.shape(1)) +
                 " floats cannot hold the conv state of (K - 1) * C = " +
                 std::to_string(conv_floats) + " at conv_offset " + std::to_string(conv_offset));
  }
  check_batch(op, slots, cu_seqlens, has_state);
  auto stream = stream_for(s, true, lo, lo);
  // The pages go in as they are: eval writes into their buffer.
  std::vector<mx::array> inputs = {
      mx::contiguous(x, false, stream), side_input(weight, stream), lo,
      as_int32(slots, stream), as_int32(cu_seqlens, stream), as_int32(has_state, stream)};
  auto outs = mx::array::make_arrays({x.shape(), lo.shape()}, {x.dtype(), mx::float32},
                                     std::make_shared<GdnShortConv>(stream, conv_offset), inputs);
  return {outs[0], outs[1]};
}

void GdnShortConv::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  auto& y = outputs[0];
  y.set_data(mx::allocator::malloc(y.nbytes()));
  // The output pages alias the input's buffer: the state is written in place.
  auto layout = alias_cache(inputs[2], outputs[1]);
  const auto& x = inputs[0];
  const auto& weight = inputs[1];
  cpu::ShortConvArgs a{x.data<void>(), elem_of(x.dtype()), weight.data<void>(),
                       elem_of(weight.dtype()), static_cast<int>(x.shape(1)),
                       static_cast<int>(weight.shape(1)), outputs[1].data<float>(),
                       static_cast<int64_t>(inputs[2].shape(1)), conv_offset_, y.data<void>(),
                       elem_of(y.dtype()), batch_of(inputs, 3, x.shape(0), inputs[2].shape(0))};
  const char* src = inputs[2].data<char>();
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) encoder.set_input_array(in);
  for (auto& out : outputs) encoder.set_output_array(out);
  encoder.dispatch([a, layout, src]() {
    if (layout) cpu::copy_to_row_contiguous(src, *layout, reinterpret_cast<char*>(a.lo));
    cpu::short_conv_cpu(a);
  });
}

void GdnShortConv::eval_gpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  require_row_contiguous("gdn_short_conv", inputs,
                         {"x", "weight", "lo", "slots", "cu_seqlens", "has_state"});
  metal::gdn_short_conv_gpu(stream(), inputs, outputs, conv_offset_);
#else
  (void)inputs;
  (void)outputs;
  no_gpu(name());
#endif
}

std::tuple<mx::array, mx::array, mx::array> gdn_gated_delta(
    const mx::array& q, const mx::array& k, const mx::array& v, const mx::array& g,
    const mx::array& beta, const mx::array& lo, const mx::array& hi, const mx::array& slots,
    const mx::array& cu_seqlens, const mx::array& has_state, int ssm_offset, int heads_in_lo,
    bool delta_rule, int chunk, mx::StreamOrDevice s) {
  const char* op = "gdn_gated_delta";
  if (q.ndim() != 3) fail(op, "q must be [T, Hk, Dk]");
  check_float(op, q, "q", "[T, Hk, Dk]");
  if (k.shape() != q.shape()) fail(op, "k must be [T, Hk, Dk] like q");
  check_float(op, k, "k", "[T, Hk, Dk]");
  const int t = q.shape(0), hk = q.shape(1), dk = q.shape(2);
  if (v.ndim() != 3 || v.shape(0) != t) fail(op, "v must be [T, Hv, Dv] with q's T");
  check_float(op, v, "v", "[T, Hv, Dv]");
  const int hv = v.shape(1), dv = v.shape(2);
  if (hk < 1 || hv % hk != 0) {
    fail(op, "v's Hv = " + std::to_string(hv) + " heads must be a multiple of q's Hk = " +
                 std::to_string(hk));
  }
  const bool scalar_gate = g.shape() == mx::Shape{t, hv};
  if (!scalar_gate && g.shape() != mx::Shape{t, hv, dk}) {
    fail(op, "g must be [T, Hv] or [T, Hv, Dk]");
  }
  check_float(op, g, "g", "[T, Hv] or [T, Hv, Dk]");
  if (beta.shape() != mx::Shape{t, hv}) fail(op, "beta must be [T, Hv]");
  check_float(op, beta, "beta", "[T, Hv]");
  check_pages(op, lo, "lo");
  check_pages(op, hi, "hi");
  if (hi.shape(0) != lo.shape(0)) fail(op, "lo and hi must have the same num_blocks");
  if (heads_in_lo < 0 || heads_in_lo > hv) fail(op, "heads_in_lo must be in [0, Hv]");
  if (ssm_offset < 0) fail(op, "ssm_offset must be >= 0");
  const int64_t per = static_cast<int64_t>(dv) * dk;
  if (ssm_offset + heads_in_lo * per > lo.shape(1)) {
    fail(op, "lo's rows of W = " + std::to_string(lo.shape(1)) + " floats cannot hold " +
                 std::to_string(heads_in_lo) + " head states at ssm_offset " +
                 std::to_string(ssm_offset) + " (need " +
                 std::to_string(ssm_offset + heads_in_lo * per) + ")");
  }
  if ((hv - heads_in_lo) * per > hi.shape(1)) {
    fail(op, "hi's rows of W = " + std::to_string(hi.shape(1)) + " floats cannot hold the other " +
                 std::to_string(hv - heads_in_lo) + " head states (need " +
                 std::to_string((hv - heads_in_lo) * per) + ")");
  }
  if (chunk != 0 && !cpu::gdn_chunk_supported(chunk)) {
    std::string sizes;
    for (int c : cpu::kGdnChunkSizes) sizes += (sizes.empty() ? "" : " or ") + std::to_string(c);
    fail(op, "chunk must be 0 (token by token) or " + sizes + ", got " + std::to_string(chunk));
  }
  check_batch(op, slots, cu_seqlens, has_state);
  const bool fits = q.dtype() == k.dtype() && q.dtype() == v.dtype() &&
      dispatch::metal_supports_gdn(dk);
  auto stream = stream_for(s, fits, lo, hi);
  auto rows = [&](const mx::array& a) { return mx::contiguous(a, false, stream); };
  std::vector<mx::array> inputs = {rows(q), rows(k), rows(v), side_input(g, stream),
                                   side_input(beta, stream), lo, hi,
                                   as_int32(slots, stream), as_int32(cu_seqlens, stream),
                                   as_int32(has_state, stream)};
  auto outs = mx::array::make_arrays(
      {v.shape(), lo.shape(), hi.shape()}, {q.dtype(), mx::float32, mx::float32},
      std::make_shared<GdnGatedDelta>(stream, ssm_offset, heads_in_lo, delta_rule, chunk),
      inputs);
  return {outs[0], outs[1], outs[2]};
}

void GdnGatedDelta::eval_cpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
  auto& y = outputs[0];
  y.set_data(mx::allocator::malloc(y.nbytes()));
  auto lo_layout = alias_cache(inputs[5], outputs[1]);
  auto hi_layout = alias_cache(inputs[6], outputs[2]);
  const auto& q = inputs[0];
  const auto& v = inputs[2];
  cpu::GatedDeltaArgs a{};
  a.q = q.data<void>();
  a.q_type = elem_of(q.dtype());
  a.k = inputs[1].data<void>();
  a.k_type = elem_of(inputs[1].dtype());
  a.v = v.data<void>();
  a.v_type = elem_of(v.dtype());
  a.g = inputs[3].data<void>();
  a.g_type = elem_of(inputs[3].dtype());
  a.vector_gate = inputs[3].ndim() == 3;
  a.beta = inputs[4].data<void>();
  a.beta_type = elem_of(inputs[4].dtype());
  a.num_k_heads = q.shape(1);
  a.num_v_heads = v.shape(1);
  a.head_k_dim = q.shape(2);
  a.head_v_dim = v.shape(2);
  a.lo = outputs[1].data<float>();
  a.lo_width = inputs[5].shape(1);
  a.hi = outputs[2].data<float>();
  a.hi_width = inputs[6].shape(1);
  a.ssm_offset = ssm_offset_;
  a.heads_in_lo = heads_in_lo_;
  a.delta_rule = delta_rule_;
  a.chunk = chunk_;
  a.y = y.data<void>();
  a.y_type = elem_of(y.dtype());
  a.batch = batch_of(inputs, 7, q.shape(0), inputs[5].shape(0));
  const char* lo_src = inputs[5].data<char>();
  const char* hi_src = inputs[6].data<char>();
  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) encoder.set_input_array(in);
  for (auto& out : outputs) encoder.set_output_array(out);
  encoder.dispatch([a, lo_layout, hi_layout, lo_src, hi_src]() {
    if (lo_layout) cpu::copy_to_row_contiguous(lo_src, *lo_layout, reinterpret_cast<char*>(a.lo));
    if (hi_layout) cpu::copy_to_row_contiguous(hi_src, *hi_layout, reinterpret_cast<char*>(a.hi));
    cpu::gated_delta_cpu(a);
  });
}

void GdnGatedDelta::eval_gpu(const std::vector<mx::array>& inputs,
                             std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  require_row_contiguous("gdn_gated_delta", inputs,
                         {"q", "k", "v", "g", "beta", "lo", "hi", "slots", "cu_seqlens",
                          "has_state"});
  metal::gdn_gated_delta_gpu(stream(), inputs, outputs, ssm_offset_, heads_in_lo_, delta_rule_,
                             chunk_);
#else
  (void)inputs;
  (void)outputs;
  no_gpu(name());
#endif
}

} // namespace vllm_metal
