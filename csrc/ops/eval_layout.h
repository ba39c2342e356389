// The layout of an op's input as the op is evaluated, shared by eval_cpu and
// eval_gpu. Read it there and only there: an array that is not yet evaluated
// reports MLX's default flags (row-contiguous), so what the op saw when it was
// built says nothing about, say, a lazy transpose of a cache.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpu/runtime/strided_copy.h"
#include "mlx/array.h"

namespace vllm_metal {

// nullopt when `a` is row-contiguous, else the layout to copy it from.
std::optional<cpu::StridedLayout> strided_layout(const mlx::core::array& a);

// For eval_gpu, which cannot copy (the Metal kernels index their inputs as
// row-contiguous, and MLX does not export its GPU copy): throws
// std::invalid_argument naming the first of `inputs` (called `names`, in order)
// that is not row-contiguous.
void require_row_contiguous(const std::string& op,
                            const std::vector<mlx::core::array>& inputs,
                            const std::vector<std::string>& names);

} // namespace vllm_metal
