#include "ops/expert_matmul.h"

#include <stdexcept>
#include <string>

#include "cpu/linear/experts_cpu.h"
#include "metal/experts_metal.h"
#include "metal/kernel_library.h"
#include "ops/cpu_inputs.h"
#include "ops/eval_layout.h"
#include "platform.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("expert_matmul: " + msg);
}

} // namespace

mx::array expert_matmul(
    const mx::array& x,
    const mx::array& idx,
    const mx::array& w,
    const std::optional<mx::array>& scales,
    const std::optional<mx::array>& biases,
    int bits,
    int group_size,
    const std::optional<mx::array>& bias,
    const std::string& mode,
    bool int8_activations,
    bool tiled,
    mx::StreamOrDevice s) {
  if (x.ndim() != 2 || !is_linear_float(x.dtype())) fail("x must be float [R, K]");
  if (idx.ndim() != 1 || (idx.dtype() != mx::int32 && idx.dtype() != mx::uint32)) {
    fail("idx must be int32 or uint32 [P]");
  }
  const int rows = x.shape(0), k = x.shape(1), pairs = idx.shape(0);
  if (rows == 0 ? pairs != 0 : pairs % rows != 0) {
    fail("x has " + std::to_string(rows) + " rows, which must divide the " +
         std::to_string(pairs) + " pairs of idx");
  }
  if (w.ndim() != 3) fail("w must be [E, N, K] (float) or uint32 [E, N, K * bits / 32]");
  const int experts = w.shape(0), n = w.shape(1);
  std::vector<mx::array> inputs = {x, idx, w};
  mx::Dtype weight_type = w.dtype();
  if (mode != "affine" && mode != "mxfp4") fail("mode must be \"affine\" or \"mxfp4\"");
  const bool mxfp4 = mode == "mxfp4";
  if (int8_activations && (bits == 0 || mxfp4)) {
    fail("int8_activations applies to affine-quantized experts (bits 4 or 8)");
  }
  if (tiled && !int8_activations) {
    fail("tiled=True (weights in the int8 kernels' tile order) needs int8_activations=True");
  }
  if (bits == 0) {
    if (mxfp4) fail("mode \"mxfp4\" needs bits 4");
    if (!is_linear_float(w.dtype()) || w.shape(2) != k) fail("float w must be [E, N, K]");
    if (scales || biases) fail("scales and biases are for quantized w (bits 4 or 8)");
  } else {
    if (bits != 4 && bits != 8) fail("bits must be 0 (float w), 4 or 8");
    if (mxfp4 ? group_size != 32 : group_size != 32 && group_size != 64 && group_size != 128) {
      fail(mxfp4 ? "mode \"mxfp4\" has group_size 32" : "group_size must be 32, 64 or 128");
    }
    if (mxfp4 && bits != 4) fail("mode \"mxfp4\" has bits 4");
    if (w.dtype() != mx::uint32 ||
        static_cast<int64_t>(w.shape(2)) * 32 != static_cast<int64_t>(k) * bits) {
      fail("quantized w must be uint32 [E, N, K * bits / 32] for x [R, K]");
    }
    const bool scales_ok = scales && scales->ndim() == 3 && scales->shape(0) == experts &&
        scales->shape(1) == n && static_cast<int64_t>(scales->shape(2)) * group_size == k;
    if (mxfp4) {
      if (!scales_ok || scales->dtype() != mx::uint8 || biases) {
        fail("mxfp4 scales must be uint8 [E, N, K / 32] and biases None");
      }
      inputs.push_back(*scales);
    } else {
      if (!scales_ok || !is_linear_float(scales->dtype()) || !biases ||
          biases->shape() != scales->shape() || biases->dtype() != scales->dtype()) {
        fail("scales and biases must be float [E, N, K / group_size], same dtype");
      }
      inputs.push_back(*scales);
      inputs.push_back(*biases);
      weight_type = scales->dtype();
    }
  }
  if (mxfp4) weight_type = x.dtype();  // MLX's mxfp4 products take x's dtype
  mx::Dtype out_type = mx::promote_types(x.dtype(), weight_type);
  if (bias) {
    if (bias->ndim() != 2 || bias->shape(0) != experts || bias->shape(1) != n ||
        !is_linear_float(bias->dtype())) {
      fail("bias must be float [E, N]");
    }
    inputs.push_back(*bias);
    out_type = mx::promote_types(out_type, bias->dtype());
  }
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu && metal::kernels_configured();
  if (stream.device == mx::Device::gpu && !gpu) stream = mx::default_stream(mx::Device::cpu);
  if (gpu) {
    if (x.dtype() != weight_type || (bias && bias->dtype() != weight_type)) {
      fail("on the GPU, x, the weights (or scales) and bias must share one dtype");
    }
    // The Metal kernel indexes row-contiguous inputs and takes the pairs grouped by
    // expert: idx's argsort, computed in the graph.
    for (auto& a : inputs) a = mx::contiguous(a, false, stream);
    const mx::array ids = mx::astype(idx, mx::int32, stream);
    inputs[1] = ids;
    inputs.push_back(mx::astype(mx::argsort(ids, 0, stream), mx::int32, stream));
  }
  return mx::array(
      {pairs, n}, out_type,
      std::make_shared<ExpertMatmul>(stream, bits, bits == 0 ? 0 : group_size, mxfp4,
                                     bias.has_value(), int8_activations, tiled),
      std::move(inputs));
}

void ExpertMatmul::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const int bits = bits_, group_size = group_size_;
  const bool mxfp4 = mxfp4_, int8 = int8_activations_, tiled = tiled_;
  const int bias = has_bias_ ? static_cast<int>(inputs.size()) - 1 : -1;
  const cpu::Elem out_type = elem_of(outputs[0].dtype());
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [bits, group_size, mxfp4, int8, tiled, bias,
                    out_type](const std::vector<RowContiguous>& in, void* dst) {
    const auto& x = in[0].view;
    const auto& w = in[2].view;
    cpu::ExpertStack stack{};
    stack.quantized = bits != 0;
    stack.experts = w.shape(0);
    const int64_t n = w.shape(1), k = x.shape(1);
    if (stack.quantized) {
      const auto& scales = in[3].view;
      stack.q = {w.data<uint32_t>(), scales.data<void>(),
                 mxfp4 ? nullptr : in[4].view.data<void>(),
                 mxfp4 ? cpu::Elem::F32 : elem_of(scales.dtype()), bits, group_size, n, k};
      stack.q.mxfp4 = mxfp4;
      stack.q.tiled = tiled;
    } else {
      stack.d = {w.data<void>(), elem_of(w.dtype()), n, k};
    }
    const int64_t pairs = in[1].view.size();
    cpu::ExpertIO io{x.data<void>(), elem_of(x.dtype()),
                     x.shape(0) > 0 ? pairs / x.shape(0) : 1,
                     // uint32 ids below 2^31 read the same as int32; larger ones
                     // read negative and are refused as out of range.
                     static_cast<const int32_t*>(in[1].view.data<void>()), pairs,
                     bias >= 0 ? in[bias].view.data<void>() : nullptr,
                     bias >= 0 ? elem_of(in[bias].view.dtype()) : cpu::Elem::F32,
                     dst, out_type};
    io.int8_activations = int8;
    cpu::expert_matmul_cpu(stack, io);
  });
}

void ExpertMatmul::eval_gpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  if (int8_activations_ || tiled_) {
    throw std::invalid_argument(
        "expert_matmul: int8_activations and tiled are CPU kernels; use the CPU stream");
  }
  std::vector<std::string> names = {"x", "idx", "w"};
  if (bits_ != 0) names.push_back("scales");
  if (bits_ != 0 && !mxfp4_) names.push_back("biases");
  if (has_bias_) names.push_back("bias");
  names.push_back("order");
  require_row_contiguous("expert_matmul", inputs, names);
  metal::experts_gpu(stream(), inputs, outputs[0], bits_, group_size_, mxfp4_, has_bias_);
#else
  (void)inputs;
  (void)outputs;
  throw std::runtime_error(
      "VllmMetalExpertMatmul has no GPU implementation on this platform; use the CPU stream.");
#endif
}

bool ExpertMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const ExpertMatmul&>(other);
  return bits_ == o.bits_ && group_size_ == o.group_size_ && mxfp4_ == o.mxfp4_ &&
      has_bias_ == o.has_bias_ && int8_activations_ == o.int8_activations_ && tiled_ == o.tiled_;
}

std::vector<mx::Shape> ExpertMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[1].shape(0), inputs[2].shape(1)}};
}

} // namespace vllm_metal
