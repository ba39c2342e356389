#include "ops/sample_tokens.h"

#include <stdexcept>
#include <string>

#include "cpu/sample_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("sample_tokens: " + msg);
}

} // namespace

mx::array sample_tokens(
    const mx::array& logits,
    const mx::array& temperature,
    const mx::array& keys,
    mx::StreamOrDevice s) {
  if (logits.ndim() != 2 || logits.shape(1) < 1) fail("logits must be [R, V] with V >= 1");
  if (!mx::issubdtype(logits.dtype(), mx::floating)) fail("logits must be floating point");
  const int rows = logits.shape(0);
  if (temperature.shape() != mx::Shape{rows}) fail("temperature must be [R]");
  if (!mx::issubdtype(temperature.dtype(), mx::floating)) fail("temperature must be float");
  if (keys.shape() != mx::Shape{rows, 2} || keys.dtype() != mx::uint32) {
    fail("keys must be uint32 [R, 2]");
  }
  auto stream = mx::to_stream(s);
  auto f32 = [&](const mx::array& a) {
    return a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, stream);
  };
  return mx::array(
      {rows}, mx::int32, std::make_shared<SampleTokens>(stream),
      {f32(logits), f32(temperature), keys});
}

void SampleTokens::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [](const std::vector<RowContiguous>& in, void* dst) {
    const auto& logits = in[0].view;
    cpu::sample_rows_cpu(logits.data<float>(), logits.shape(0), logits.shape(1),
                         in[1].view.data<float>(), in[2].view.data<uint32_t>(),
                         static_cast<int32_t*>(dst));
  });
}

void SampleTokens::eval_gpu(
    const std::vector<mx::array>& /* inputs */,
    std::vector<mx::array>& /* outputs */) {
  throw std::runtime_error(
      "VllmMetalSampleTokens is a CPU kernel; on Metal the sampler draws with MLX's own ops "
      "(run this op on the CPU stream: stream=mx.cpu)");
}

std::vector<mx::Shape> SampleTokens::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0)}};
}

} // namespace vllm_metal
