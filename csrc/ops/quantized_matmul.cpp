#include "ops/quantized_matmul.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/linear/linear_cpu.h"
#include "cpu/linear/row_argmax.h"
#include "cpu/runtime/scratch.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("quantized_matmul: " + msg);
}

// x's shape without its last dimension: the argmax result's.
mx::Shape rows_shape(const mx::array& x) {
  return mx::Shape(x.shape().begin(), x.shape().end() - 1);
}

} // namespace

mx::array quantized_matmul(
    const mx::array& x,
    const mx::array& w,
    const mx::array& scales,
    const std::optional<mx::array>& biases,
    int bits,
    int group_size,
    const std::optional<mx::array>& bias,
    bool int8_activations,
    float zero_point,
    int argmax_columns,
    const std::optional<mx::array>& argmax_allowed,
    bool tiled,
    mx::StreamOrDevice s) {
  if (bits != 4 && bits != 8) fail("bits must be 4 or 8");
  if (group_size != 32 && group_size != 64 && group_size != 128) {
    fail("group_size must be 32, 64 or 128");
  }
  if (x.ndim() < 1 || !is_linear_float(x.dtype())) fail("x must be [..., K] float");
  if (w.ndim() != 2 || w.dtype() != mx::uint32) fail("w must be uint32 [N, K * bits / 32]");
  if (scales.ndim() != 2 || !is_linear_float(scales.dtype()) ||
      (biases && (biases->shape() != scales.shape() || biases->dtype() != scales.dtype()))) {
    fail("scales and biases must be float [N, K / group_size], same dtype");
  }
  if (!biases && !int8_activations) {
    fail("biases=None (symmetric weights, bias = -zero_point * scale) needs "
         "int8_activations=True");
  }
  if (tiled && !int8_activations) {
    fail("tiled=True (weights in the int8 kernels' tile order) needs int8_activations=True");
  }
  if (!std::isfinite(zero_point)) fail("zero_point must be finite");
  if (biases && zero_point != 0.0f) {
    fail("zero_point applies only with biases=None; the biases given already hold the offset");
  }
  const int n = w.shape(0);
  const int k = x.shape(-1);
  if (static_cast<int64_t>(w.shape(1)) * 32 != static_cast<int64_t>(k) * bits ||
      scales.shape(0) != n || static_cast<int64_t>(scales.shape(1)) * group_size != k) {
    fail("shapes of x [..., K], w [N, K * bits / 32] and scales [N, K / group_size] disagree");
  }
  std::vector<mx::array> inputs = {x, w, scales};
  if (biases) inputs.push_back(*biases);
  if (bias) {
    if (bias->ndim() != 1 || bias->shape(0) != n || !is_linear_float(bias->dtype())) {
      fail("bias must be float [N]");
    }
    inputs.push_back(*bias);
  }
  auto stream = mx::to_stream(s);
  // MLX's type promotion, as nn.QuantizedLinear (matmul, then + bias) gives.
  mx::Dtype out_type = mx::promote_types(x.dtype(), scales.dtype());
  if (bias) out_type = mx::promote_types(out_type, bias->dtype());
  if (argmax_columns < 0 || argmax_columns > n) {
    fail("argmax_columns must be in [0, N = " + std::to_string(n) + "], got " +
         std::to_string(argmax_columns));
  }
  if (argmax_columns > 0 && out_type != mx::float32) {
    // The argmax of products rounded to a narrower type can differ (ties).
    fail("argmax_columns needs a float32 result: x, scales and bias must promote to float32");
  }
  if (argmax_allowed) {
    const int64_t words = (static_cast<int64_t>(argmax_columns) + 31) / 32;
    const mx::Shape rows = rows_shape(x);
    const mx::array& a = *argmax_allowed;
    if (argmax_columns == 0) fail("argmax_allowed needs argmax_columns");
    if (a.dtype() != mx::uint32 || a.ndim() != x.ndim() ||
        !std::equal(rows.begin(), rows.end(), a.shape().begin()) || a.shape(-1) < words) {
      fail("argmax_allowed must be uint32 [..., >= " + std::to_string(words) +
           "] with x's leading shape");
    }
    inputs.push_back(a);
  }
  auto primitive = std::make_shared<QuantizedMatmul>(
      stream, bits, group_size, bias.has_value(), int8_activations, biases.has_value(),
      zero_point, argmax_columns, argmax_allowed.has_value(), tiled);
  if (argmax_columns > 0) {
    return mx::array(rows_shape(x), mx::int32, std::move(primitive), std::move(inputs));
  }
  return mx::array(with_last_dim(x, n), out_type, std::move(primitive), std::move(inputs));
}

void QuantizedMatmul::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const bool has_biases = has_biases_;
  const int bias = has_bias_ ? (has_biases ? 4 : 3) : -1;
  const int bits = bits_, group_size = group_size_;
  const bool int8 = int8_activations_;
  const float zero_point = zero_point_;
  const int argmax_columns = argmax_columns_;
  const int allowed = has_allowed_ ? static_cast<int>(inputs.size()) - 1 : -1;
  const bool tiled = tiled_;
  const mx::Dtype out_type = argmax_columns > 0 ? mx::float32 : outputs[0].dtype();
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [bias, bits, group_size, int8, has_biases, zero_point, out_type,
                    argmax_columns, allowed, tiled](const std::vector<RowContiguous>& in, void* dst) {
    const auto& scales = in[2].view;
    cpu::QuantMatrix w{in[1].view.data<uint32_t>(), scales.data<void>(),
                       has_biases ? in[3].view.data<void>() : nullptr,
                       elem_of(scales.dtype()), bits, group_size, in[1].view.shape(0),
                       in[0].view.shape(-1), zero_point};
    w.tiled = tiled;
    if (argmax_columns == 0) {
      cpu::LinearIO io = linear_io(in, bias, dst, out_type);
      io.int8_activations = int8;
      return cpu::quantized_matmul_cpu(w, io);
    }
    // The products into scratch that stays warm for the argmax pass.
    const int64_t rows = in[0].view.size() / w.k;
    thread_local cpu::ScratchVector<float> logits;
    logits.resize(static_cast<size_t>(rows * w.n));
    cpu::LinearIO io = linear_io(in, bias, logits.data(), out_type);
    io.int8_activations = int8;
    cpu::quantized_matmul_cpu(w, io);
    const uint32_t* bits = allowed >= 0 ? in[allowed].view.data<uint32_t>() : nullptr;
    cpu::row_argmax_cpu(logits.data(), rows, w.n, argmax_columns, static_cast<int32_t*>(dst), bits,
                        allowed >= 0 ? in[allowed].view.shape(-1) : 0);
  });
}

bool QuantizedMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const QuantizedMatmul&>(other);
  return bits_ == o.bits_ && group_size_ == o.group_size_ && has_bias_ == o.has_bias_ &&
      int8_activations_ == o.int8_activations_ && has_biases_ == o.has_biases_ &&
      zero_point_ == o.zero_point_ && argmax_columns_ == o.argmax_columns_ &&
      has_allowed_ == o.has_allowed_ && tiled_ == o.tiled_;
}

std::vector<mx::Shape> QuantizedMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  if (argmax_columns_ > 0) return {rows_shape(inputs[0])};
  return {with_last_dim(inputs[0], inputs[1].shape(0))};
}

} // namespace vllm_metal
