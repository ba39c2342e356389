// Shared eval_cpu plumbing of the linear ops: storage formats and
// row-contiguous views of their inputs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpu/linear_cpu.h"
#include "cpu/strided_copy.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace vllm_metal {

// The kernels' storage format of a float dtype (float32, bfloat16, float16).
cpu::Elem elem_of(mlx::core::Dtype t);

bool is_linear_float(mlx::core::Dtype t);

// An input as the CPU task reads it: the array itself when row-contiguous,
// else a temporary that fill() copies it into inside the task (inputs only
// hold data once the task runs).
struct RowContiguous {
  mlx::core::array view;
  std::optional<cpu::StridedLayout> copy_from;
  const char* src = nullptr;

  void fill() const;
};

RowContiguous row_contiguous(const mlx::core::array& a, mlx::core::cpu::CommandEncoder& encoder);

// Rows of x [..., K]: the product of its leading dimensions.
int64_t leading_rows(const mlx::core::array& x);

// The shape of x with its last dimension replaced by n.
mlx::core::Shape with_last_dim(const mlx::core::array& x, int n);

} // namespace vllm_metal
