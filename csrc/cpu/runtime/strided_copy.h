// Strided -> row-contiguous copy, for cache arrays that arrive as views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vllm_metal::cpu {

// Layout of an array as the CPU task sees it (strides in elements).
struct StridedLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  size_t itemsize;
};

// dst (row-contiguous, same shape) = src laid out as `layout`.
void copy_to_row_contiguous(const char* src, const StridedLayout& layout, char* dst);

} // namespace vllm_metal::cpu
