// Instantiations of the split-KV merge (body: paged_attention_v2_reduce.h).
// Host name: paged_attention_v2_reduce_{dtype}_hd{head_size}.
#include "paged_attention_v2_reduce.h"

#define VLLM_METAL_REDUCE_KERNEL(name, type, hd)                                                        \
  template [[host_name(VLLM_METAL_STRINGIFY(paged_attention_v2_reduce_##name##_hd##hd))]] [[kernel]]         \
  decltype(paged_attention_v2_reduce<type, hd>) paged_attention_v2_reduce<type, hd>;
#define VLLM_METAL_REDUCE_HEAD(args, hd) VLLM_METAL_APPLY(VLLM_METAL_REDUCE_KERNEL, VLLM_METAL_UNPACK args, hd)
#define VLLM_METAL_REDUCE_DTYPE(unused, name, type) VLLM_METAL_FOR_EACH_HEAD_SIZE(VLLM_METAL_REDUCE_HEAD, (name, type))

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_REDUCE_DTYPE, _)
