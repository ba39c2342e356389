// The LoRA kernels for the baseline ISA (the fallback, and the aarch64 path:
// NEON is part of its baseline), and the choice of table at run time.
#include "cpu/lora/lora_kernels.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace lora_generic {
namespace {
#include "cpu/linear/simd_generic.inc"
#include "cpu/lora/lora_kernels.inc"

const LoraKernels kTable = {shrink, expand, Simd::W};
}  // namespace
}  // namespace lora_generic

const LoraKernels& lora_kernels_generic() {
  return lora_generic::kTable;
}

const LoraKernels& lora_kernels() {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512:
      return lora_kernels_avx512();
    case Isa::Avx2:
      return lora_kernels_avx2();
    default:
      break;
  }
#endif
  return lora_kernels_generic();
}

}  // namespace vllm_metal::cpu
