// Instantiations of the LoRA kernels (bodies: lora.h).
// Host names: lora_shrink_{dtype}, lora_expand_{dtype} (the update alone) and
// lora_expand_add_{dtype} (added to the base output y).
#include "kernel_constants.h"
#include "lora.h"

#define VLLM_METAL_LORA_KERNELS(unused, name, type)                                            \
  template [[host_name(VLLM_METAL_STRINGIFY(lora_shrink_##name))]] [[kernel]]                   \
  decltype(lora_shrink<type>) lora_shrink<type>;                                                \
  template [[host_name(VLLM_METAL_STRINGIFY(lora_expand_##name))]] [[kernel]]                   \
  decltype(lora_expand<type, false>) lora_expand<type, false>;                                  \
  template [[host_name(VLLM_METAL_STRINGIFY(lora_expand_add_##name))]] [[kernel]]               \
  decltype(lora_expand<type, true>) lora_expand<type, true>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_LORA_KERNELS, _)
