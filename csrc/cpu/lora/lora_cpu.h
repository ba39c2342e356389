// CPU driver of the LoRA op: the low-rank update of a packed step, each row
// with its own adapter, computed as a grouped shrink and expand on the pool.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

// out[t, offset + c] = (y[t, offset + c] +) scale[a] * B[a, :, c] . (A[a] @ x[t])
// for a = idx[t] >= 0 and c < out_features; rows with idx -1 get no update.
// All float arrays row-contiguous. x, y and out are of `type`; a and b of
// `weight_type`, which is `type` or, beside an F32 type, BF16 or F16 (half
// adapters read as fp32: half the bytes a step streams).
struct LoraArgs {
  const void* x;          // [rows, in_features]
  const int32_t* idx;     // [rows], each in [-1, num_slots)
  const void* a;          // [num_slots, rank, in_features]
  const void* b;          // [num_slots, rank, b_ld]: columns [0, out_features) are read
  const float* scale;     // [num_slots]
  const void* y;          // [rows, out_cols], or null: out is the update alone
  void* out;              // [rows, out_cols]; may be y's own buffer (in_place)
  Elem type;              // of x, y and out
  Elem weight_type;       // of a and b
  int64_t rows;
  int64_t in_features;
  int64_t out_features;
  int64_t rank;
  int64_t num_slots;
  int64_t out_cols;       // out_features when y is null
  int64_t column_offset;  // column of out holding update column 0
  bool in_place;          // out is y: columns outside the segment are already there
  // Elements from one B row to the next; 0: out_features. Larger when b points at
  // a block of columns of a fused projection's B (the decoder stack's slices).
  int64_t b_ld = 0;
};

// Raises std::out_of_range, before writing anything, for an idx outside
// [-1, num_slots), std::invalid_argument for a pair of types it does not
// take. The result of a row depends on that row alone: no sum is
// split or reordered by the batch, the thread count or the other adapters.
void lora_cpu(const LoraArgs& args);

}  // namespace vllm_metal::cpu
