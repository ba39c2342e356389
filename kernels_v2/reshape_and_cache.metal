// Instantiations of the KV-cache write (body: reshape_and_cache.h).
// Host name: reshape_and_cache_{dtype}.
#include "kernel_constants.h"
#include "reshape_and_cache.h"

#define VLLM_METAL_CACHE_KERNEL(unused, name, type)                                          \
  template [[host_name(VLLM_METAL_STRINGIFY(reshape_and_cache_##name))]] [[kernel]]              \
  decltype(reshape_and_cache<type>) reshape_and_cache<type>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_CACHE_KERNEL, _)
