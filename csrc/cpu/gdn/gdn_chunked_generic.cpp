// The chunked gated delta rule for the baseline ISA (the fallback, and the
// aarch64 path: NEON is part of its baseline), and the choice of table at run time.
#include "cpu/gdn/gdn_chunked.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace gdn_generic {
namespace {
#include "cpu/linear/simd_generic.inc"
#include "cpu/gdn/gdn_chunked.inc"

const GdnChunkKernels kTable = {chunked_rows};
}  // namespace
}  // namespace gdn_generic

const GdnChunkKernels& gdn_chunk_kernels_generic() {
  return gdn_generic::kTable;
}

const GdnChunkKernels& gdn_chunk_kernels() {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512:
      return gdn_chunk_kernels_avx512();
    case Isa::Avx2:
      return gdn_chunk_kernels_avx2();
    default:
      break;
  }
#endif
  return gdn_chunk_kernels_generic();
}

}  // namespace vllm_metal::cpu
