#include "ops/eval_layout.h"

#include <stdexcept>

namespace vllm_metal {

namespace mx = mlx::core;

std::optional<cpu::StridedLayout> strided_layout(const mx::array& a) {
  if (a.flags().row_contiguous) return std::nullopt;
  return cpu::StridedLayout{
      {a.shape().begin(), a.shape().end()}, {a.strides().begin(), a.strides().end()}, a.itemsize()};
}

void require_row_contiguous(const std::string& op,
                            const std::vector<mx::array>& inputs,
                            const std::vector<std::string>& names) {
  for (size_t i = 0; i < inputs.size() && i < names.size(); ++i) {
    if (strided_layout(inputs[i])) {
      throw std::invalid_argument(
          op + ": " + names[i] + " is not row-contiguous (a strided view such as a transpose), which the "
          "Metal kernels cannot read; pass a row-contiguous array (mx.contiguous)");
    }
  }
}

} // namespace vllm_metal
