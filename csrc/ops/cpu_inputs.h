// Shared eval_cpu plumbing of the linear ops: storage formats and
// row-contiguous views of their inputs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cpu/linear/linear_cpu.h"
#include "cpu/runtime/strided_copy.h"
#include "mlx/allocator.h"
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

// `a` evaluated and row-contiguous (a copy if it was not), so raw views taken
// once, at load, stay valid for as long as the array is held.
mlx::core::array materialized(const mlx::core::array& a);

// Point `out` at `cache`'s own buffer, so a kernel writing `out` updates the
// cache in place. A cache that is not row-contiguous gets a fresh buffer
// instead, and the layout the task must first copy it from.
std::optional<cpu::StridedLayout> alias_cache(const mlx::core::array& cache,
                                              mlx::core::array& out);

// The eval_cpu of a CPU op: allocates the outputs, takes row-contiguous views
// of `inputs`, registers both with the stream's encoder and, once the inputs
// are computed, runs task(views, the outputs' data pointers) on the stream.
template <typename Task>
void dispatch_on_rows(const mlx::core::Stream& stream,
                      const std::vector<mlx::core::array>& inputs,
                      std::vector<mlx::core::array>& outputs,
                      Task task) {
  auto& encoder = mlx::core::cpu::get_command_encoder(stream);
  std::vector<void*> dst;
  for (auto& out : outputs) {
    out.set_data(mlx::core::allocator::malloc(out.nbytes()));
    dst.push_back(out.data<void>());
  }
  std::vector<RowContiguous> in;
  in.reserve(inputs.size());
  for (const auto& a : inputs) in.push_back(row_contiguous(a, encoder));
  for (const auto& a : inputs) encoder.set_input_array(a);
  for (auto& out : outputs) encoder.set_output_array(out);
  encoder.dispatch(
      [in = std::move(in), dst = std::move(dst), task = std::move(task)]() {
        for (const auto& r : in) r.fill();
        task(in, dst);
      });
}

// The same for a one-output op: task(views, out's data).
template <typename Task>
void dispatch_on_rows(const mlx::core::Stream& stream,
                      const std::vector<mlx::core::array>& inputs,
                      mlx::core::array& out,
                      Task task) {
  std::vector<mlx::core::array> outputs = {out};
  dispatch_on_rows(stream, inputs, outputs,
                   [task = std::move(task)](const std::vector<RowContiguous>& in,
                                            const std::vector<void*>& dst) {
                     task(in, dst[0]);
                   });
}

// The LinearIO of a matmul whose x is in[0] and optional bias in[bias_index]
// (-1: none), writing out_type into dst.
cpu::LinearIO linear_io(const std::vector<RowContiguous>& in, int bias_index, void* dst,
                        mlx::core::Dtype out_type);

// Rows of x [..., K]: the product of its leading dimensions.
int64_t leading_rows(const mlx::core::array& x);

// The shape of x with its last dimension replaced by n.
mlx::core::Shape with_last_dim(const mlx::core::array& x, int n);

} // namespace vllm_metal
