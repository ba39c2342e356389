// CPU kernels of RMS normalization and rotary position embedding.
//
// MLX's CPU backend runs mx.fast.rms_norm and mx.fast.rope as graphs of ~11
// and ~28 small ops; on a decode step those node counts, not the arithmetic,
// are the cost. These do each in one pass over the data.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w (w optional);
// x and out row-contiguous [rows, d], fp32 arithmetic.
struct RmsNormArgs {
  const void* x;
  Elem x_type;
  const void* w;   // [d] or nullptr
  Elem w_type;
  void* out;
  Elem out_type;
  int64_t rows;
  int64_t d;
  float eps;
};

void rms_norm_cpu(const RmsNormArgs& a);

// Rotary embedding of x viewed as [b, m, l, d] (contiguous): element
// (bi, mi, li) sits at position offsets[bi or 0] + li, and feature pair i of
// the first `dims` features turns by position * scale * inv_freq[i].
// Pairs are (2i, 2i+1) when traditional, else (i, i + dims/2). Features past
// `dims` are copied. inv_freq[i] = base^(-2i/dims), or 1 / freqs[i] when
// freqs is given (float32 [dims/2]).
struct RopeArgs {
  const void* x;
  void* out;
  Elem type;       // of x and out
  int64_t b;
  int64_t m;
  int64_t l;
  int64_t d;
  int dims;
  bool traditional;
  const int32_t* offsets;
  int64_t num_offsets;  // 1 (shared) or b
  const float* freqs;   // nullptr: use base
  double base;
  double scale;
  // Optional cos/sin of every row's angles, [b * l, dims / 2] each (from
  // rope_table_cpu): callers rotating several tensors at the same positions
  // form the angles once.
  const float* cos_table = nullptr;
  const float* sin_table = nullptr;
};

void rope_cpu(const RopeArgs& a);
// cos/sin [b * l, dims / 2] of a's angles (a.x, out, m, d are not read).
void rope_table_cpu(const RopeArgs& a, float* cos_table, float* sin_table);

} // namespace vllm_metal::cpu
