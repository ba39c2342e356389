#include "dispatch/diagnostics.h"

#include <atomic>
#include <mutex>

namespace vllm_metal::dispatch {

namespace {

std::atomic<bool> g_enabled{false};
std::mutex g_mutex;
std::optional<std::string> g_route;
std::optional<int> g_partition;

}  // namespace

void set_paged_dispatch_diagnostics(bool enabled) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_enabled = enabled;
  g_route.reset();
  g_partition.reset();
}

void record_paged_dispatch(const PagedDispatch& d) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_route = route_name(d.route);
  g_partition = d.route == PagedRoute::GqaDecode ? std::optional<int>(d.partition_size) : std::nullopt;
}

std::optional<std::string> last_paged_dispatch() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_route;
}

std::optional<int> last_gqa_partition_size() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_partition;
}

}  // namespace vllm_metal::dispatch
