#include "ops/activation.h"

#include <stdexcept>
#include <string>

#include "cpu/activation/activation_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

mx::array activation(const mx::array& x, int kind, mx::StreamOrDevice s) {
  if (x.dtype() != mx::float32) {
    throw std::invalid_argument("activation: x must be float32");
  }
  if (kind < 0 || kind > 3) {
    throw std::invalid_argument("activation: kind must be 0 (silu), 1 (gelu_approx), 2 "
                                "(gelu) or 3 (gelu_fast_approx), got " + std::to_string(kind));
  }
  return mx::array(x.shape(), mx::float32,
                   std::make_shared<ActivationOp>(mx::to_stream(s), kind), {x});
}

void ActivationOp::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  const auto act = static_cast<cpu::Activation>(kind_);
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [act](const std::vector<RowContiguous>& in, void* dst) {
                     const auto& x = in[0].view;
                     cpu::activation_cpu(act, x.data<float>(), static_cast<float*>(dst),
                                         static_cast<int64_t>(x.size()));
                   });
}

bool ActivationOp::is_equivalent(const mx::Primitive& other) const {
  return kind_ == static_cast<const ActivationOp&>(other).kind_;
}

std::vector<mx::Shape> ActivationOp::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

} // namespace vllm_metal
