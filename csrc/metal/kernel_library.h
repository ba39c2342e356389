// Where eval_gpu gets the kernels_v2 Metal library: a prebuilt .metallib
// (release wheels, built by the same CMake build) or source text JIT-compiled
// by MLX (VLLM_METAL_BUILD_FROM_SOURCE=1). Set once by vllm_metal.native.get_ops().
#pragma once

#include <string>

namespace vllm_metal::metal {

void set_library_path(const std::string& path);
void set_library_source(const std::string& source);

// True once a path or source is set: the ops may then run on the GPU stream.
bool kernels_configured();

std::string library_path();    // "" unless set_library_path was called
std::string library_source();  // "" unless set_library_source was called

}  // namespace vllm_metal::metal
