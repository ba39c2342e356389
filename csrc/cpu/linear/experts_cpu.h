// CPU driver of the expert matmul (mixture-of-experts layers): each (token,
// expert) pair's row times its expert's matrix, with the pairs grouped by
// expert so every touched expert's weights are read once per call.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

// E matrices [n, k] stored back to back ([E, n, k] in the layout of one
// QuantMatrix (affine or MXFP4) or DenseMatrix per expert): expert e's starts
// e * n rows on.
struct ExpertStack {
  bool quantized;
  QuantMatrix q;   // expert 0 (quantized)
  DenseMatrix d;   // expert 0 (dense)
  int64_t experts;
};

// Pair p multiplies row p / pairs_per_row of x (the token's row when every
// pair of a token shares it, or its own row) with expert idx[p]'s matrix.
struct ExpertIO {
  const void* x;            // [pairs / pairs_per_row, k]
  Elem x_type;
  int64_t pairs_per_row;
  const int32_t* idx;       // [pairs]
  int64_t pairs;
  const void* bias;         // [E, n] or nullptr: expert e's bias
  Elem bias_type;
  void* out;                // [pairs, n]
  Elem out_type;
  // Affine-quantized experts only (MXFP4 ignores it): x rounded to int8 per 32
  // columns, as LinearIO::int8_activations; each pair's row is then computed
  // alike whatever else the call holds (linear_q8.h).
  bool int8_activations = false;
};

// out[p] = x[p / pairs_per_row] . W[idx[p]]^T (+ bias[idx[p]]), fp32
// accumulation. Each expert's pairs go through the linear kernels as one
// GEMV (a few rows: weights decoded in registers) or GEMM (decoded panels),
// or with int8 activations the int8 kernel, one pool job over every (expert,
// column block). An affine stack may be tiled (QuantMatrix::tiled, each
// expert's [n, ...] arrays tiled on their own): int8 activations only. Raises std::out_of_range,
// before writing anything, for an idx outside [0, E).
void expert_matmul_cpu(const ExpertStack& w, const ExpertIO& io);

} // namespace vllm_metal::cpu
