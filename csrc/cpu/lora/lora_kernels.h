// Per-instruction-set kernels of the LoRA op.
//
// lora_kernels.inc holds the bodies, written against the linear ops' `Simd`
// vocabulary (cpu/linear/simd_*.inc); lora_{avx512,avx2,generic}.cpp compile
// them once per ISA and export a table each. Every sum is accumulated in fp32
// in one fixed order per output, so the rows processed together never change
// a row's result.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"
#include "cpu/runtime/isa.h"

namespace vllm_metal::cpu {

// Rows of one adapter, gathered by the driver (indices into x and out).
struct LoraRows {
  const int32_t* rows;
  int64_t count;
};

// u[i * ldu + j] = scale * (x[rows[i], :] . a[j, :]) for i < count, j < rank_rows.
struct LoraShrink {
  const void* x;      // rows in_features elements apart
  LoraRows rows;
  const void* a;      // rank_rows rows of in_features elements
  int64_t rank_rows;
  int64_t in_features;
  float scale;
  float* u;
  int64_t ldu;
  Elem type;          // of x
  Elem weight_type;   // of a: type, or BF16/F16 beside an F32 x
};

// For i < count and segment columns c in [c0, c1), at o = rows[i] * ldo + offset + c:
// out[o] = (y[o] +) sum over j < rank, in order, of u[i * ldu + j] * b[j * ldb + c].
struct LoraExpand {
  const float* u;
  int64_t ldu;
  LoraRows rows;
  const void* b;      // one adapter's B [rank, >= c1 columns], at the segment's column 0
  int64_t ldb;        // elements from one B row to the next
  int64_t rank;
  int64_t c0, c1;
  const void* y;      // null: no base output
  void* out;
  int64_t ldo;        // of out and y
  int64_t offset;
  Elem type;          // of y and out
  Elem weight_type;   // of b: type, or BF16/F16 beside an F32 out
};

struct LoraKernels {
  void (*shrink)(const LoraShrink& s);
  void (*expand)(const LoraExpand& e);
  int width;  // fp32 lanes per vector: the unit of the expand's column blocks
};

const LoraKernels& lora_kernels_generic();
#if VLLM_METAL_X86_DISPATCH
const LoraKernels& lora_kernels_avx2();
const LoraKernels& lora_kernels_avx512();
#endif

// The table of the active ISA (cpu/runtime/isa.h).
const LoraKernels& lora_kernels();

}  // namespace vllm_metal::cpu
