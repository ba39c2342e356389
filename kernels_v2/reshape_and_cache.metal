// Instantiations of the KV-cache write (body: reshape_and_cache.h).
// Host names: reshape_and_cache_{dtype}, reshape_and_cache_quant_{dtype} (the
// model's K/V dtype into a quantized cache).
#include "kernel_constants.h"
#include "reshape_and_cache.h"

#define VLLM_METAL_CACHE_KERNEL(unused, name, type)                                          \
  template [[host_name(VLLM_METAL_STRINGIFY(reshape_and_cache_##name))]] [[kernel]]              \
  decltype(reshape_and_cache<type>) reshape_and_cache<type>;

#define VLLM_METAL_QUANT_CACHE_KERNEL(unused, name, type)                                    \
  template [[host_name(VLLM_METAL_STRINGIFY(reshape_and_cache_quant_##name))]] [[kernel]]        \
  decltype(reshape_and_cache_quant<type>) reshape_and_cache_quant<type>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_CACHE_KERNEL, _)
VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_QUANT_CACHE_KERNEL, _)
