#include "metal/kernel_library.h"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>

namespace vllm_metal::metal {

namespace {

std::mutex g_mutex;
KernelLibrary g_library;  // name "" until configured

// FNV-1a: stable across runs and platforms, and plenty to tell sources apart.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string library_name(const std::string& kind, const std::string& text) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return "vllm_metal_kernels_v2_" + kind + "_" + hex;
}

void set_library_path(const std::string& path) {
  if (path.empty()) throw std::invalid_argument("metallib path must not be empty");
  KernelLibrary library{library_name("metallib", path), path, nullptr};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_library = std::move(library);
}

void set_library_source(const std::string& source) {
  if (source.empty()) throw std::invalid_argument("Metal source must not be empty");
  KernelLibrary library{library_name("source", source), "", std::make_shared<const std::string>(source)};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_library = std::move(library);
}

bool kernels_configured() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return !g_library.name.empty();
}

KernelLibrary configured_library() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_library.name.empty()) {
    throw std::runtime_error("vllm-metal: the Metal kernels were not loaded (vllm_metal.native.get_ops())");
  }
  return g_library;
}

}  // namespace vllm_metal::metal
