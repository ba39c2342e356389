#include "ops/top_logprobs.h"

#include <stdexcept>
#include <string>

#include "cpu/sampling/logprobs_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("top_logprobs: " + msg);
}

std::vector<mx::Shape> shapes(int rows, int k) {
  return {{rows, k + 1}, {rows, k + 1}, {rows}};
}

} // namespace

std::vector<mx::array> top_logprobs(
    const mx::array& x,
    const mx::array& token,
    int k,
    bool normalize,
    mx::StreamOrDevice s) {
  if (x.ndim() != 2 || x.shape(1) < 1) fail("x must be [R, V] with V >= 1");
  if (!mx::issubdtype(x.dtype(), mx::floating)) fail("x must be floating point");
  if (k < 0) fail("k must be >= 0");
  const int rows = x.shape(0);
  if (token.shape() != mx::Shape{rows} || !mx::issubdtype(token.dtype(), mx::integer)) {
    fail("token must be an integer array [R]");
  }
  auto stream = mx::to_stream(s);
  auto as = [&](const mx::array& a, mx::Dtype t) {
    return a.dtype() == t ? a : mx::astype(a, t, stream);
  };
  return mx::array::make_arrays(
      shapes(rows, k), {mx::int32, mx::float32, mx::int32},
      std::make_shared<TopLogprobs>(stream, k, normalize),
      {as(x, mx::float32), as(token, mx::int32)});
}

void TopLogprobs::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const int k = k_;
  const bool normalize = normalize_;
  dispatch_on_rows(stream(), inputs, outputs,
                   [k, normalize](const std::vector<RowContiguous>& in,
                                  const std::vector<void*>& dst) {
    const auto& x = in[0].view;
    cpu::top_logprobs_cpu(x.data<float>(), x.shape(0), x.shape(1), in[1].view.data<int32_t>(),
                          k, normalize, static_cast<int32_t*>(dst[0]),
                          static_cast<float*>(dst[1]), static_cast<int32_t*>(dst[2]));
  });
}

bool TopLogprobs::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const TopLogprobs&>(other);
  return k_ == o.k_ && normalize_ == o.normalize_;
}

std::vector<mx::Shape> TopLogprobs::output_shapes(const std::vector<mx::array>& inputs) {
  return shapes(inputs[0].shape(0), k_);
}

} // namespace vllm_metal
