#include "ops/dense_matmul.h"

#include <stdexcept>
#include <string>

#include "cpu/linear_cpu.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
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
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& encoder = mx::cpu::get_command_encoder(stream());
  std::vector<RowContiguous> in;
  for (const auto& a : inputs) in.push_back(row_contiguous(a, encoder));

  const auto& x = in[0].view;
  const auto& wv = in[1].view;
  cpu::DenseMatrix w{wv.data<void>(), elem_of(wv.dtype()), wv.shape(0), wv.shape(1)};
  cpu::LinearIO io;
  io.x = x.data<void>();
  io.x_type = elem_of(x.dtype());
  io.m = leading_rows(x);
  io.bias = has_bias_ ? in[2].view.data<void>() : nullptr;
  io.bias_type = has_bias_ ? elem_of(in[2].view.dtype()) : cpu::Elem::F32;
  io.out = out.data<void>();
  io.out_type = elem_of(out.dtype());

  for (const auto& a : inputs) encoder.set_input_array(a);
  encoder.set_output_array(out);
  encoder.dispatch([in = std::move(in), w, io]() {
    for (const auto& r : in) r.fill();
    cpu::dense_matmul_cpu(w, io);
  });
}

void DenseMatmul::eval_gpu(
    const std::vector<mx::array>& /* inputs */,
    std::vector<mx::array>& /* outputs */) {
  throw std::runtime_error(
      "VllmMetalDenseMatmul is a CPU kernel; on Metal use x @ w.T "
      "(run this op on the CPU stream: stream=mx.cpu)");
}

bool DenseMatmul::is_equivalent(const mx::Primitive& other) const {
  return has_bias_ == static_cast<const DenseMatmul&>(other).has_bias_;
}

std::vector<mx::Shape> DenseMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  return {with_last_dim(inputs[0], inputs[1].shape(0))};
}

} // namespace vllm_metal
