// Instantiations of the unified paged varlen kernel (body: paged_attention_varlen.h).
// Host name: paged_attention_varlen_{dtype}_hd{head_size}_bs{block_size}.
#include "paged_attention_varlen.h"

#define VLLM_METAL_VARLEN_KERNEL(name, type, hd, bs)                                          \
  template [[host_name(VLLM_METAL_STRINGIFY(paged_attention_varlen_##name##_hd##hd##_bs##bs))]] [[kernel]] \
  decltype(paged_attention_varlen<type, hd, bs>) paged_attention_varlen<type, hd, bs>;
#define VLLM_METAL_VARLEN_BLOCK(args, bs) VLLM_METAL_APPLY(VLLM_METAL_VARLEN_KERNEL, VLLM_METAL_UNPACK args, bs)
#define VLLM_METAL_VARLEN_HEAD(args, hd) \
  VLLM_METAL_FOR_EACH_BLOCK_SIZE(VLLM_METAL_VARLEN_BLOCK, (VLLM_METAL_UNPACK args, hd))
#define VLLM_METAL_VARLEN_DTYPE(unused, name, type) VLLM_METAL_FOR_EACH_HEAD_SIZE(VLLM_METAL_VARLEN_HEAD, (name, type))

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_VARLEN_DTYPE, _)
