#include "ops/sample_tokens.h"

#include <stdexcept>
#include <string>

#include "cpu/sampling/sample_cpu.h"
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
    const std::optional<mx::array>& min_p,
    const std::optional<mx::array>& top_k,
    const std::optional<mx::array>& top_p,
    const std::optional<mx::array>& allowed,
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
  auto as = [&](const mx::array& a, mx::Dtype t) {
    return a.dtype() == t ? a : mx::astype(a, t, stream);
  };
  std::vector<mx::array> inputs = {as(logits, mx::float32), as(temperature, mx::float32), keys};
  auto per_row = [&](const std::optional<mx::array>& a, const char* name, mx::Dtype t) {
    if (!a) return;
    if (a->shape() != mx::Shape{rows}) fail(std::string(name) + " must be [R]");
    inputs.push_back(as(*a, t));
  };
  per_row(min_p, "min_p", mx::float32);
  per_row(top_k, "top_k", mx::int32);
  per_row(top_p, "top_p", mx::float32);
  if (allowed) {
    const int words = (logits.shape(1) + 31) / 32;
    if (allowed->dtype() != mx::uint32 || allowed->ndim() != 2 || allowed->shape(0) != rows ||
        allowed->shape(1) < words) {
      fail("allowed must be uint32 [R, >= " + std::to_string(words) + "]");
    }
    inputs.push_back(*allowed);
  }
  return mx::array(
      {rows}, mx::int32,
      std::make_shared<SampleTokens>(stream, min_p.has_value(), top_k.has_value(),
                                     top_p.has_value(), allowed.has_value()),
      std::move(inputs));
}

void SampleTokens::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const bool has_min_p = has_min_p_, has_top_k = has_top_k_, has_top_p = has_top_p_,
             has_allowed = has_allowed_;
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [=](const std::vector<RowContiguous>& in, void* dst) {
    const auto& logits = in[0].view;
    cpu::SampleFilters filters;
    size_t next = 3;
    if (has_min_p) filters.min_p = in[next++].view.data<float>();
    if (has_top_k) filters.top_k = in[next++].view.data<int32_t>();
    if (has_top_p) filters.top_p = in[next++].view.data<float>();
    if (has_allowed) {
      filters.allowed = in[next].view.data<uint32_t>();
      filters.allowed_ld = in[next].view.shape(1);
    }
    cpu::sample_rows_cpu(logits.data<float>(), logits.shape(0), logits.shape(1),
                         in[1].view.data<float>(), in[2].view.data<uint32_t>(), filters,
                         static_cast<int32_t*>(dst));
  });
}

bool SampleTokens::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const SampleTokens&>(other);
  return has_min_p_ == o.has_min_p_ && has_top_k_ == o.has_top_k_ && has_top_p_ == o.has_top_p_ &&
      has_allowed_ == o.has_allowed_;
}

std::vector<mx::Shape> SampleTokens::output_shapes(const std::vector<mx::array>& inputs) {
  return {{inputs[0].shape(0)}};
}

} // namespace vllm_metal
