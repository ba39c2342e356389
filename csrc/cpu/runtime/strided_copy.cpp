#include "cpu/runtime/strided_copy.h"

#include <cstring>

namespace vllm_metal::cpu {

namespace {

// Copies dimension `dim` onwards; returns the advanced destination pointer.
char* copy_dim(const char* src, const StridedLayout& l, size_t dim, char* dst) {
  const int64_t n = l.shape[dim];
  const int64_t step = l.strides[dim] * static_cast<int64_t>(l.itemsize);
  if (dim + 1 == l.shape.size()) {
    if (l.strides[dim] == 1) {
      std::memcpy(dst, src, n * l.itemsize);
      return dst + n * l.itemsize;
    }
    for (int64_t i = 0; i < n; ++i, src += step, dst += l.itemsize) {
      std::memcpy(dst, src, l.itemsize);
    }
    return dst;
  }
  for (int64_t i = 0; i < n; ++i, src += step) {
    dst = copy_dim(src, l, dim + 1, dst);
  }
  return dst;
}

} // namespace

void copy_to_row_contiguous(const char* src, const StridedLayout& layout, char* dst) {
  if (layout.shape.empty()) {
    std::memcpy(dst, src, layout.itemsize);
    return;
  }
  for (int64_t n : layout.shape) {
    if (n == 0) return;
  }
  copy_dim(src, layout, 0, dst);
}

} // namespace vllm_metal::cpu
