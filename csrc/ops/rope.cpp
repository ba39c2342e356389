#include "ops/rope.h"

#include <stdexcept>
#include <string>

#include "cpu/norm_rope/norm_rope_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("rope: " + msg);
}

} // namespace

mx::array rope(
    const mx::array& x,
    int dims,
    bool traditional,
    std::optional<float> base,
    float scale,
    const mx::array& offset,
    const std::optional<mx::array>& freqs,
    mx::StreamOrDevice s) {
  if (!is_linear_float(x.dtype())) fail("x must be float32, bfloat16 or float16");
  if (x.ndim() < 3) fail("x must be at least 3-D [B, ..., L, D]");
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1)) {
    fail("dims must be even and in (0, D = " + std::to_string(x.shape(-1)) + "], got " +
         std::to_string(dims));
  }
  if (base.has_value() == freqs.has_value()) fail("give exactly one of base and freqs");
  if (!mx::issubdtype(offset.dtype(), mx::integer)) fail("offset must be an integer array");
  if (offset.ndim() > 1 || (offset.ndim() == 1 && offset.size() != 1 &&
                            offset.shape(0) != x.shape(0))) {
    fail("offset must be a scalar or [B] with B = x's first axis " + std::to_string(x.shape(0)));
  }
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {
      x, offset.dtype() == mx::int32 ? offset : mx::astype(offset, mx::int32, stream)};
  if (freqs.has_value()) {
    if (freqs->ndim() != 1 || freqs->shape(0) != dims / 2) {
      fail("freqs must be [dims / 2] = [" + std::to_string(dims / 2) + "]");
    }
    inputs.push_back(freqs->dtype() == mx::float32 ? *freqs
                                                   : mx::astype(*freqs, mx::float32, stream));
  }
  return mx::array(
      x.shape(), x.dtype(),
      std::make_shared<Rope>(stream, dims, traditional, base.value_or(0.0f), scale),
      std::move(inputs));
}

void Rope::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  cpu::RopeArgs args{};
  args.dims = dims_;
  args.traditional = traditional_;
  args.base = base_;
  args.scale = scale_;
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [base = args](const std::vector<RowContiguous>& in, void* dst) {
    const auto& x = in[0].view;
    cpu::RopeArgs args = base;
    if (x.size() == 0) return;
    args.x = x.data<void>();
    args.out = dst;
    args.type = elem_of(x.dtype());
    args.b = x.shape(0);
    args.l = x.shape(-2);
    args.d = x.shape(-1);
    args.m = x.size() / (args.b * args.l * args.d);
    args.offsets = in[1].view.data<int32_t>();
    args.num_offsets = in[1].view.size();
    args.freqs = in.size() > 2 ? in[2].view.data<float>() : nullptr;
    cpu::rope_cpu(args);
  });
}

bool Rope::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const Rope&>(other);
  return dims_ == o.dims_ && traditional_ == o.traditional_ && base_ == o.base_ &&
         scale_ == o.scale_;
}

std::vector<mx::Shape> Rope::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

} // namespace vllm_metal
