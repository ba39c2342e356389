// Where eval_gpu gets the kernels_v2 Metal libraries: prebuilt .metallib files
// (release wheels, built by the same CMake build) or source text JIT-compiled
// by MLX (VLLM_METAL_BUILD_FROM_SOURCE=1). Set by vllm_metal.native.get_ops().
//
// Two libraries: the main one (Metal 3.1, every kernel but the tensor-op ones)
// and the tensor-op one (Metal 4's MetalPerformancePrimitives: the NaxPrefill
// kernels). They are apart so that a toolchain or OS without Metal 4, or a
// compile error only Apple's compiler finds, costs the tensor-op routes only:
// the main library never holds a tensor-op source.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace vllm_metal::metal {

enum class LibraryKind { Main, TensorOps };

void set_library_path(const std::string& path, LibraryKind kind = LibraryKind::Main);
void set_library_source(const std::string& source, LibraryKind kind = LibraryKind::Main);

// True once the main library's path or source is set: the ops may then run on
// the GPU stream.
bool kernels_configured();
// True once a tensor-op library is set (no copy: eval_gpu asks on every call).
bool tensor_kernels_configured();

struct KernelLibrary {
  // MLX caches a library by name for the life of the process, so the name is
  // derived from what is loaded: a library configured later (a metallib, then
  // JIT source) is loaded too, instead of MLX handing back the first.
  std::string name;
  std::string path;                            // a .metallib, or "" for
  std::shared_ptr<const std::string> source;  // source to JIT-compile
};

// The configured main library; throws std::runtime_error if none is.
KernelLibrary configured_library();

// The configured tensor-op library, if any (a build without a Metal 4 toolchain
// has none).
std::optional<KernelLibrary> configured_tensor_library();

// The cache name of a library loaded from `kind` ("metallib" or "source", with
// "tensor_" in front for the tensor-op library) `text` (its path or its source).
std::string library_name(const std::string& kind, const std::string& text);

}  // namespace vllm_metal::metal
