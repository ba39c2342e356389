#include "ops/dense_matmul.h"

#include <stdexcept>
#include <string>

#include "cpu/linear/linear_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("dense_matmul: " + msg);
}

} // namespace

mx::array dense_matmul(
    const mx::array& x,
    const mx::array& w,
    const std::optional<mx::array>& bias,
    mx::StreamOrDevice s) {
  if (x.ndim() < 1 || !is_linear_float(x.dtype())) fail("x must be [..., K] float");
  if (w.ndim() != 2 || !is_linear_float(w.dtype())) fail("w must be float [N, K]");
  if (w.shape(1) != x.shape(-1)) fail("x [..., K] and w [N, K] disagree on K");
  const int n = w.shape(0);
  std::vector<mx::array> inputs = {x, w};
  if (bias) {
    if (bias->ndim() != 1 || bias->shape(0) != n || !is_linear_float(bias->dtype())) {
      fail("bias must be float [N]");
    }
    inputs.push_back(*bias);
  }
  // MLX's type promotion, as nn.Linear (matmul, then + bias) gives.
  mx::Dtype out_type = mx::promote_types(x.dtype(), w.dtype());
  if (bias) out_type = mx::promote_types(out_type, bias->dtype());
  return mx::array(
      with_last_dim(x, n),
      out_type,
      std::make_shared<DenseMatmul>(mx::to_stream(s), bias.has_value()),
      std::move(inputs));
}

void DenseMatmul::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const int bias = has_bias_ ? 2 : -1;
  const mx::Dtype out_type = outputs[0].dtype();
  dispatch_on_rows(stream(), inputs, outputs[0], [bias, out_type](const std::vector<RowContiguous>& in, void* dst) {
    const auto& w = in[1].view;
    cpu::dense_matmul_cpu({w.data<void>(), elem_of(w.dtype()), w.shape(0), w.shape(1)},
                          linear_io(in, bias, dst, out_type));
  });
}

bool DenseMatmul::is_equivalent(const mx::Primitive& other) const {
  return has_bias_ == static_cast<const DenseMatmul&>(other).has_bias_;
}

std::vector<mx::Shape> DenseMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  return {with_last_dim(inputs[0], inputs[1].shape(0))};
}

} // namespace vllm_metal
