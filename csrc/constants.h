// Kernel constants and build facts exported to Python.
#pragma once

#include "mlx/version.h"

// Both macros come from vllm_metal/native/constants.py via CMakeLists.txt.
#if !defined(VLLM_METAL_PARTITION_SIZE) || !defined(VLLM_METAL_KERNEL_BLOCK_SIZES)
#error "Kernel constants must be passed by CMake from vllm_metal/native/constants.py"
#endif
#ifndef VLLM_METAL_KERNELS_HASH
#error "VLLM_METAL_KERNELS_HASH must be passed by CMake (cmake/kernels_v2.cmake)"
#endif

#define VLLM_METAL_STR_(x) #x
#define VLLM_METAL_STR(x) VLLM_METAL_STR_(x)

namespace vllm_metal {

inline constexpr int kPartitionSize = VLLM_METAL_PARTITION_SIZE;
inline constexpr int kKernelBlockSizes[] = {VLLM_METAL_KERNEL_BLOCK_SIZES};

// The MLX version whose headers this extension was compiled against; the
// Python loader refuses to run against any other (private ABI).
inline constexpr const char* kMlxBuildVersion =
    VLLM_METAL_STR(MLX_VERSION_MAJOR) "." VLLM_METAL_STR(
        MLX_VERSION_MINOR) "." VLLM_METAL_STR(MLX_VERSION_PATCH);

// Hash stamp of the kernels_v2/ sources this build saw (cmake/kernels_v2.cmake);
// the loader compares it with the sources on disk and refuses stale builds.
inline constexpr const char* kKernelsHash = VLLM_METAL_KERNELS_HASH;

} // namespace vllm_metal
