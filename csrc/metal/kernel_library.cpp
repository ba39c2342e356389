#include "metal/kernel_library.h"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>

namespace vllm_metal::metal {

namespace {

std::mutex g_mutex;
KernelLibrary g_libraries[2];  // by LibraryKind; name "" until configured

// FNV-1a: stable across runs and platforms, and plenty to tell sources apart.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void configure(LibraryKind kind, const char* how, const std::string& text, KernelLibrary library) {
  if (text.empty()) throw std::invalid_argument(std::string("the Metal library's ") + how + " must not be empty");
  const std::string prefix = kind == LibraryKind::TensorOps ? "tensor_" : "";
  library.name = library_name(prefix + how, text);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_libraries[static_cast<int>(kind)] = std::move(library);
}

}  // namespace

std::string library_name(const std::string& kind, const std::string& text) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return "vllm_metal_kernels_v2_" + kind + "_" + hex;
}

void set_library_path(const std::string& path, LibraryKind kind) {
  configure(kind, "metallib", path, {"", path, nullptr});
}

void set_library_source(const std::string& source, LibraryKind kind) {
  configure(kind, "source", source, {"", "", std::make_shared<const std::string>(source)});
}

bool kernels_configured() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return !g_libraries[static_cast<int>(LibraryKind::Main)].name.empty();
}

bool tensor_kernels_configured() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return !g_libraries[static_cast<int>(LibraryKind::TensorOps)].name.empty();
}

KernelLibrary configured_library() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const KernelLibrary& library = g_libraries[static_cast<int>(LibraryKind::Main)];
  if (library.name.empty()) {
    throw std::runtime_error("vllm-metal: the Metal kernels were not loaded (vllm_metal.native.get_ops())");
  }
  return library;
}

std::optional<KernelLibrary> configured_tensor_library() {
  std::lock_guard<std::mutex> lock(g_mutex);
  const KernelLibrary& library = g_libraries[static_cast<int>(LibraryKind::TensorOps)];
  if (library.name.empty()) return std::nullopt;
  return library;
}

}  // namespace vllm_metal::metal
