// Instantiations of the MLA kernels (bodies: mla.h).
// Host names: latent_cache_write_{dtype}, mla_attention_{dtype} (queries, cache and
// output of one dtype).
#include "kernel_constants.h"
#include "mla.h"

#define VLLM_METAL_MLA_KERNELS(unused, name, type)                                             \
  template [[host_name(VLLM_METAL_STRINGIFY(latent_cache_write_##name))]] [[kernel]]            \
  decltype(latent_cache_write<type>) latent_cache_write<type>;                                  \
  template [[host_name(VLLM_METAL_STRINGIFY(mla_attention_##name))]] [[kernel]]                 \
  decltype(mla_attention<type>) mla_attention<type>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_MLA_KERNELS, _)
