// Instantiations of the Gated DeltaNet kernels (bodies: gdn.h, gdn_chunked.h).
// Host names: gdn_short_conv_{dtype}, gdn_conv_state_{dtype}, gdn_gated_delta_{dtype},
// gdn_gated_delta_chunked_{dtype}
// (x, or q, k, v, and the output of one dtype; weight, g, beta and pages float32).
#include "kernel_constants.h"
#include "gdn.h"
#include "gdn_chunked.h"

#define VLLM_METAL_GDN_KERNELS(unused, name, type)                                         \
  template [[host_name(VLLM_METAL_STRINGIFY(gdn_short_conv_##name))]] [[kernel]]            \
  decltype(gdn_short_conv<type>) gdn_short_conv<type>;                                      \
  template [[host_name(VLLM_METAL_STRINGIFY(gdn_conv_state_##name))]] [[kernel]]            \
  decltype(gdn_conv_state<type>) gdn_conv_state<type>;                                      \
  template [[host_name(VLLM_METAL_STRINGIFY(gdn_gated_delta_##name))]] [[kernel]]           \
  decltype(gdn_gated_delta<type>) gdn_gated_delta<type>;                                    \
  template [[host_name(VLLM_METAL_STRINGIFY(gdn_gated_delta_chunked_##name))]] [[kernel]]   \
  decltype(gdn_gated_delta_chunked<type>) gdn_gated_delta_chunked<type>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_GDN_KERNELS, _)
