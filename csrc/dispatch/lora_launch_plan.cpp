#include "dispatch/lora_launch_plan.h"

#include <algorithm>
#include <stdexcept>

namespace vllm_metal::dispatch {

namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kShrinkSimdgroups = 4;  // kLoraShrinkSimdgroups in kernels_v2/lora.h

uint32_t u32(int64_t v) {
  if (v < 1 || v > int64_t(UINT32_MAX)) throw std::invalid_argument("lora: launch dimension out of range");
  return static_cast<uint32_t>(v);
}

}  // namespace

std::string lora_shrink_kernel_name(KernelDtype dtype) {
  return std::string("lora_shrink_") + dtype_name(dtype);
}

std::string lora_expand_kernel_name(KernelDtype dtype, bool add) {
  return std::string(add ? "lora_expand_add_" : "lora_expand_") + dtype_name(dtype);
}

LoraPlan plan_lora(const LoraProblem& p) {
  if (p.dtype == KernelDtype::Unsupported) throw std::invalid_argument("lora: no Metal kernels for this dtype");
  if (p.rows < 1 || p.in_features < 0 || p.out_features < 0 || p.rank < 1 || p.num_slots < 1) {
    throw std::invalid_argument("lora: rows, rank and num_slots must be >= 1, in/out features >= 0");
  }
  const int out_cols = p.add ? p.out_cols : p.out_features;
  const int offset = p.add ? p.column_offset : 0;
  if (offset < 0 || offset + p.out_features > out_cols) {
    throw std::invalid_argument("lora: the update's columns must lie within out's");
  }
  if (p.in_place && !p.add) throw std::invalid_argument("lora: only an update added to y can be in place");
  LoraPlan plan;
  plan.params.rows = p.rows;
  plan.params.in_features = p.in_features;
  plan.params.out_features = p.out_features;
  plan.params.rank = p.rank;
  plan.params.num_slots = p.num_slots;
  plan.params.out_cols = out_cols;
  plan.params.column_offset = offset;
  // In place, y's columns outside the segment are already out's.
  plan.params.first_column = p.in_place ? offset : 0;
  plan.params.launch_columns = p.in_place ? p.out_features : out_cols;
  plan.u_floats = int64_t(p.rows) * p.rank;
  plan.shrink = {lora_shrink_kernel_name(p.dtype),
                 {u32((p.rank + kShrinkSimdgroups - 1) / kShrinkSimdgroups), u32(p.rows), 1},
                 {kShrinkSimdgroups * kSimdWidth, 1, 1},
                 {false, false, false, false},
                 false};
  const int64_t columns = std::max(plan.params.launch_columns, 1);
  plan.expand = {lora_expand_kernel_name(p.dtype, p.add),
                 {u32((columns + kLoraExpandThreads - 1) / kLoraExpandThreads), u32(p.rows), 1},
                 {kLoraExpandThreads, 1, 1},
                 {false, false, false, false},
                 false};
  return plan;
}

}  // namespace vllm_metal::dispatch
