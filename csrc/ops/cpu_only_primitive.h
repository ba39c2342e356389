// Base of the ops that have a CPU body only. On a GPU stream they raise,
// saying what to use on Metal instead: MLX's own kernels stay there.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/primitives.h"

namespace vllm_metal {

class CpuOnlyPrimitive : public mlx::core::Primitive {
 public:
  // on_metal: the rest of "<name> is a CPU kernel; on Metal ...".
  CpuOnlyPrimitive(mlx::core::Stream stream, const char* on_metal)
      : mlx::core::Primitive(stream), on_metal_(on_metal) {}

  void eval_gpu(
      const std::vector<mlx::core::array>& /* inputs */,
      std::vector<mlx::core::array>& /* outputs */) final {
    throw std::runtime_error(std::string(name()) + " is a CPU kernel; on Metal " + on_metal_);
  }

 private:
  const char* on_metal_;
};

} // namespace vllm_metal
