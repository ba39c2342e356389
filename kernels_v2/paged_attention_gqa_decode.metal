// Instantiations of the GQA decode kernel (body: paged_attention_gqa_decode.h):
// 4 geometries x KERNEL_BLOCK_SIZES = 12 specializations per element type.
// Host name: paged_attention_gqa_decode_{dtype}_hq{Hq}_hkv{Hkv}_hd{D}_bs{block_size}.
#include "paged_attention_gqa_decode.h"

#define VLLM_METAL_GQA_KERNEL(name, type, hq, hkv, hd, bs)                                          \
  template [[host_name(VLLM_METAL_STRINGIFY(                                                                \
      paged_attention_gqa_decode_##name##_hq##hq##_hkv##hkv##_hd##hd##_bs##bs))]] [[kernel]]          \
  decltype(paged_attention_gqa_decode<type, hq, hkv, hd, bs>) paged_attention_gqa_decode<type, hq, hkv, hd, bs>;
#define VLLM_METAL_GQA_BLOCK(args, bs) VLLM_METAL_APPLY(VLLM_METAL_GQA_KERNEL, VLLM_METAL_UNPACK args, bs)
#define VLLM_METAL_GQA_GEOMETRY(args, geometry) \
  VLLM_METAL_FOR_EACH_BLOCK_SIZE(VLLM_METAL_GQA_BLOCK, (VLLM_METAL_UNPACK args, VLLM_METAL_UNPACK geometry))
#define VLLM_METAL_GQA_DTYPE(unused, name, type) VLLM_METAL_FOR_EACH_GQA_GEOMETRY(VLLM_METAL_GQA_GEOMETRY, (name, type))

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_GQA_DTYPE, _)
