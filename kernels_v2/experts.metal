// Instantiations of the expert-matmul kernel (body: experts.h).
// Host names: experts_matmul_{float,q4,q8,mxfp4}_{dtype}: float weights of the
// activations' dtype, MLX affine 4/8-bit codes with scales of that dtype, or
// MXFP4 codes with E8M0 scales.
#include "kernel_constants.h"
#include "experts.h"

#define VLLM_METAL_EXPERT_KERNELS(unused, name, type)                                          \
  template [[host_name(VLLM_METAL_STRINGIFY(experts_matmul_float_##name))]] [[kernel]]          \
  decltype(experts_matmul<type, type, type, 0>) experts_matmul<type, type, type, 0>;            \
  template [[host_name(VLLM_METAL_STRINGIFY(experts_matmul_q4_##name))]] [[kernel]]             \
  decltype(experts_matmul<type, uint, type, 4>) experts_matmul<type, uint, type, 4>;            \
  template [[host_name(VLLM_METAL_STRINGIFY(experts_matmul_q8_##name))]] [[kernel]]             \
  decltype(experts_matmul<type, uint, type, 8>) experts_matmul<type, uint, type, 8>;            \
  template [[host_name(VLLM_METAL_STRINGIFY(experts_matmul_mxfp4_##name))]] [[kernel]]          \
  decltype(experts_matmul<type, uint, uchar, 1>) experts_matmul<type, uint, uchar, 1>;

VLLM_METAL_FOR_EACH_DTYPE(VLLM_METAL_EXPERT_KERNELS, _)
