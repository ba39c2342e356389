#include "metal/kernel_library.h"

#include <mutex>
#include <stdexcept>

namespace vllm_metal::metal {

namespace {

std::mutex g_mutex;
std::string g_path;
std::string g_source;

}  // namespace

void set_library_path(const std::string& path) {
  if (path.empty()) throw std::invalid_argument("metallib path must not be empty");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_path = path;
  g_source.clear();
}

void set_library_source(const std::string& source) {
  if (source.empty()) throw std::invalid_argument("Metal source must not be empty");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_source = source;
  g_path.clear();
}

bool kernels_configured() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return !g_path.empty() || !g_source.empty();
}

std::string library_path() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_path;
}

std::string library_source() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_source;
}

}  // namespace vllm_metal::metal
