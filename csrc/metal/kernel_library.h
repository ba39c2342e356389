// Where eval_gpu gets the kernels_v2 Metal library: a prebuilt .metallib
// (release wheels, built by the same CMake build) or source text JIT-compiled
// by MLX (VLLM_METAL_BUILD_FROM_SOURCE=1). Set by vllm_metal.native.get_ops().
#pragma once

#include <memory>
#include <string>

namespace vllm_metal::metal {

void set_library_path(const std::string& path);
void set_library_source(const std::string& source);

// True once a path or source is set: the ops may then run on the GPU stream.
bool kernels_configured();

struct KernelLibrary {
  // MLX caches a library by name for the life of the process, so the name is
  // derived from what is loaded: a library configured later (a metallib, then
  // JIT source) is loaded too, instead of MLX handing back the first.
  std::string name;
  std::string path;                            // a .metallib, or "" for
  std::shared_ptr<const std::string> source;  // source to JIT-compile
};

// The configured library; throws std::runtime_error if none is.
KernelLibrary configured_library();

// The cache name of a library loaded from `kind` ("metallib" or "source")
// `text` (its path or its source).
std::string library_name(const std::string& kind, const std::string& text);

}  // namespace vllm_metal::metal
