#include "ops/rms_norm.h"

#include <stdexcept>
#include <string>

#include "cpu/norm_rope/norm_rope_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("rms_norm: " + msg);
}

} // namespace

mx::array rms_norm(
    const mx::array& x,
    const std::optional<mx::array>& weight,
    float eps,
    mx::StreamOrDevice s) {
  if (!is_linear_float(x.dtype())) fail("x must be float32, bfloat16 or float16");
  if (x.ndim() < 1 || x.shape(-1) < 1) fail("x must have a non-empty last axis");
  std::vector<mx::array> inputs = {x};
  mx::Dtype out_type = x.dtype();
  if (weight.has_value()) {
    if (!is_linear_float(weight->dtype())) fail("weight must be float32, bfloat16 or float16");
    if (weight->ndim() != 1 || weight->shape(0) != x.shape(-1)) {
      fail("weight must be [D] with D = x's last axis " + std::to_string(x.shape(-1)));
    }
    inputs.push_back(*weight);
    out_type = mx::promote_types(x.dtype(), weight->dtype());
  }
  return mx::array(x.shape(), out_type,
                   std::make_shared<RmsNorm>(mx::to_stream(s), eps), std::move(inputs));
}

void RmsNorm::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  const float eps = eps_;
  const cpu::Elem out_type = elem_of(outputs[0].dtype());
  dispatch_on_rows(stream(), inputs, outputs[0], [eps, out_type](const std::vector<RowContiguous>& in, void* dst) {
    const auto& x = in[0].view;
    const bool weighted = in.size() > 1;
    cpu::rms_norm_cpu({x.data<void>(), elem_of(x.dtype()),
                       weighted ? in[1].view.data<void>() : nullptr,
                       weighted ? elem_of(in[1].view.dtype()) : elem_of(x.dtype()), dst, out_type,
                       leading_rows(x), x.shape(-1), eps});
  });
}

bool RmsNorm::is_equivalent(const mx::Primitive& other) const {
  return eps_ == static_cast<const RmsNorm&>(other).eps_;
}

std::vector<mx::Shape> RmsNorm::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

} // namespace vllm_metal
