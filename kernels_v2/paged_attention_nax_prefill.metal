// Instantiations of the tensor-op paged prefill (body: paged_attention_nax_prefill.h),
// built only by a toolchain with Metal 4's tensor API (MetalPerformancePrimitives).
// Host name: paged_attention_nax_prefill_{dtype}_hd{head_size}_bs{block_size}.
#include "paged_attention_nax_prefill.h"

#if defined(__HAVE_TENSOR__)

#define VLLM_METAL_NAX_KERNEL(name, type, hd, bs)                                                    \
  template [[host_name(VLLM_METAL_STRINGIFY(paged_attention_nax_prefill_##name##_hd##hd##_bs##bs))]] \
  [[kernel]] decltype(paged_attention_nax_prefill<type, hd, bs>) paged_attention_nax_prefill<type, hd, bs>;
#define VLLM_METAL_NAX_BLOCK(args, bs) VLLM_METAL_APPLY(VLLM_METAL_NAX_KERNEL, VLLM_METAL_UNPACK args, bs)
#define VLLM_METAL_NAX_HEAD(args, hd) \
  VLLM_METAL_FOR_EACH_BLOCK_SIZE(VLLM_METAL_NAX_BLOCK, (VLLM_METAL_UNPACK args, hd))
#define VLLM_METAL_NAX_DTYPE(unused, name, type) VLLM_METAL_FOR_EACH_NAX_HEAD_SIZE(VLLM_METAL_NAX_HEAD, (name, type))

VLLM_METAL_FOR_EACH_NAX_DTYPE(VLLM_METAL_NAX_DTYPE, _)

#endif  // __HAVE_TENSOR__
