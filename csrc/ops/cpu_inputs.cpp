#include "ops/cpu_inputs.h"

#include "mlx/allocator.h"
#include "mlx/ops.h"
#include "mlx/transforms.h"
#include "ops/eval_layout.h"

namespace vllm_metal {

namespace mx = mlx::core;

cpu::Elem elem_of(mx::Dtype t) {
  if (t == mx::bfloat16) return cpu::Elem::BF16;
  if (t == mx::float16) return cpu::Elem::F16;
  return cpu::Elem::F32;
}

bool is_linear_float(mx::Dtype t) {
  return t == mx::float32 || t == mx::bfloat16 || t == mx::float16;
}

void RowContiguous::fill() const {
  if (copy_from) cpu::copy_to_row_contiguous(src, *copy_from, const_cast<char*>(view.data<char>()));
}

RowContiguous row_contiguous(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
  RowContiguous r{a, strided_layout(a), nullptr};
  if (!r.copy_from) return r;
  r.view = mx::array(a.shape(), a.dtype(), nullptr, {});
  r.view.set_data(mx::allocator::malloc(r.view.nbytes()));
  encoder.add_temporary(r.view);
  r.src = a.data<char>();
  return r;
}

mx::array materialized(const mx::array& a) {
  mx::array out = a;
  mx::eval(out);
  if (!out.flags().row_contiguous) {
    out = mx::contiguous(out, false, mx::Device::cpu);
    mx::eval(out);
  }
  return out;
}

std::optional<cpu::StridedLayout> alias_cache(const mx::array& cache, mx::array& out) {
  auto layout = strided_layout(cache);
  if (layout) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  } else {
    out.copy_shared_buffer(cache);
  }
  return layout;
}

cpu::LinearIO linear_io(const std::vector<RowContiguous>& in, int bias_index, void* dst,
                        mx::Dtype out_type) {
  const auto& x = in[0].view;
  cpu::LinearIO io;
  io.x = x.data<void>();
  io.x_type = elem_of(x.dtype());
  io.m = leading_rows(x);
  io.bias = bias_index >= 0 ? in[bias_index].view.data<void>() : nullptr;
  io.bias_type = bias_index >= 0 ? elem_of(in[bias_index].view.dtype()) : cpu::Elem::F32;
  io.out = dst;
  io.out_type = elem_of(out_type);
  return io;
}

int64_t leading_rows(const mx::array& x) {
  int64_t m = 1;
  for (int d = 0; d + 1 < static_cast<int>(x.ndim()); ++d) m *= x.shape(d);
  return m;
}

mx::Shape with_last_dim(const mx::array& x, int n) {
  mx::Shape shape = x.shape();
  shape.back() = n;
  return shape;
}

} // namespace vllm_metal
