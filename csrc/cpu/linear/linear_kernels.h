// Per-instruction-set kernel table of the linear ops.
//
// linear_gemv.inc and linear_gemm.inc hold one body per kernel, written
// against a small `Simd` vocabulary (simd_*.inc); linear_{avx512,avx2,
// generic}.cpp compile them once per ISA (inside a target pragma and an ISA
// namespace) and export a table each.
#pragma once

#include <cstdint>

#include "cpu/runtime/isa.h"
#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

// 4-bit rows are dequantized, and x is laid out, in "nibble order": within each
// 32-column block, the 16 even columns first, then the 16 odd ones. A packed
// byte holds (even, odd) neighbours, so this order needs no shuffles.
constexpr int kNibbleBlock = 32;

struct LinearKernels {
  // y[i * ldy + c - n0] = x[i] . W[c] for i < mr (1..4), c in [n0, n1).
  // x fp32 [mr, k] (nibble order for 4 bits); xsum [mr, k / group_size]
  // holds each group's sum of x (the biases' share of the dot product).
  void (*quant_gemv)(const QuantMatrix& w, const float* x, const float* xsum, int mr,
                     int64_t n0, int64_t n1, float* y, int64_t ldy);
  // As quant_gemv for a dense W (x in natural order, no xsum).
  void (*dense_gemv)(const DenseMatrix& w, const float* x, int mr, int64_t n0, int64_t n1,
                     float* y, int64_t ldy);
  // panels = rows [n0, n0 + nb) of W decoded to fp32 panels of panel_rows
  // rows, k-major ([ceil(nb / W), k, W]; nibble order for 4 bits). scratch
  // holds panel_rows * k floats.
  void (*quant_panels)(const QuantMatrix& w, int64_t n0, int64_t nb, float* panels,
                       float* scratch);
  void (*dense_panels)(const DenseMatrix& w, int64_t n0, int64_t nb, float* panels,
                       float* scratch);
  // y[i * ldy + j] = x[i] . W[j] for i < m, j < nb; x fp32 [m, k], W as panels.
  void (*gemm)(const float* x, int64_t m, const float* panels, int64_t nb, int64_t k, float* y,
               int64_t ldy);
  int panel_rows; // rows per panel (the ISA's vector width)
};

const LinearKernels& linear_kernels_generic();
#if VLLM_METAL_X86_DISPATCH
const LinearKernels& linear_kernels_avx2();
const LinearKernels& linear_kernels_avx512();
#endif

// The table of the active ISA (cpu/runtime/isa.h).
const LinearKernels& linear_kernels();

} // namespace vllm_metal::cpu
