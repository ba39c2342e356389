// The linear kernels for the baseline ISA (the fallback, and the aarch64 path:
// NEON is part of its baseline).
#include "cpu/linear/linear_kernels.h"

#include <algorithm>
#include <cstring>

#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace generic {
namespace {
#include "cpu/linear/simd_generic.inc"
#include "cpu/linear/linear_gemv.inc"
#include "cpu/linear/linear_gemm.inc"

const LinearKernels kTable = {quant_gemv, dense_gemv, quant_panels, dense_panels, gemm,
                              Simd::W};
} // namespace
} // namespace generic

const LinearKernels& linear_kernels_generic() {
  return generic::kTable;
}

const LinearKernels& linear_kernels() {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512:
      return linear_kernels_avx512();
    case Isa::Avx2:
      return linear_kernels_avx2();
    default:
      break;
  }
#endif
  return linear_kernels_generic();
}

} // namespace vllm_metal::cpu
