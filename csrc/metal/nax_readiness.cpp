#include "metal/nax_readiness.h"

#if VLLM_METAL_APPLE()
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <optional>

#include "dispatch/paged_dispatch.h"
#include "metal/kernel_library.h"
#include "metal/launches.h"
#include "mlx/backend/metal/metal.h"
#endif

namespace vllm_metal::metal {

#if VLLM_METAL_APPLE()

namespace mx = mlx::core;

namespace {

// Why `step` failed ("" if it did not), once per key: a library that fails to
// compile is not compiled again for every call.
template <typename Step>
std::string probe_once(const std::string& key, Step step) {
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  std::string why;
  try {
    step();
  } catch (const std::exception& e) {
    why = e.what();
    if (why.empty()) why = "unknown error";
    std::fprintf(stderr, "vllm-metal: the NaxPrefill route is off for %s: %s\n", key.c_str(), why.c_str());
  }
  known.emplace(key, why);
  return why;
}

// The launch a 64-row float16 prefill at head size 128 plans: the pipeline
// status() builds.
dispatch::KernelLaunch sample_launch() {
  dispatch::PagedProblem p;
  p.num_heads = p.num_kv_heads = 1;
  p.head_size = 128;
  p.block_size = 16;
  p.query_dtype = p.cache_dtype = dispatch::KernelDtype::Float16;
  p.seq_lens = {dispatch::kNaxTileRows};
  p.query_lens = {dispatch::kNaxTileRows};
  dispatch::PagedDispatch d;
  d.route = dispatch::PagedRoute::NaxPrefill;
  return dispatch::plan_paged_attention(p, d, {}).launches.at(0);
}

std::string launch_key(const std::string& library, const dispatch::KernelLaunch& launch) {
  std::string key = library + "/" + launch.kernel + "_fc";
  for (bool c : launch.constants) key += c ? "1" : "0";
  return key;
}

}  // namespace

bool tensor_units_available() {
  return mx::metal::is_nax_available() && tensor_kernels_configured();
}

bool tensor_launch_ready(mx::metal::Device& device, const dispatch::KernelLaunch& launch) {
  const std::optional<KernelLibrary> library = configured_tensor_library();
  if (!library) return false;
  return probe_once(launch_key(library->name, launch), [&] { pipeline(device, launch); }).empty();
}

NaxStatus nax_prefill_status() {
  if (!mx::metal::is_available()) return {"unavailable", "no Metal device"};
  if (!mx::metal::is_nax_available()) {
    return {"unavailable", "no tensor units (MLX's test: an M5-class GPU on macOS 26.2 or later)"};
  }
  const std::optional<KernelLibrary> library = configured_tensor_library();
  if (!library) return {"unavailable", "no tensor-op library (this build's Metal toolchain has no Metal 4)"};
  const dispatch::KernelLaunch launch = sample_launch();
  const std::string why = probe_once(launch_key(library->name, launch), [&] {
    pipeline(mx::metal::device(mx::Device::gpu), launch);
  });
  if (why.empty()) return {"ready", "tensor-op library loaded, " + launch.kernel + " builds"};
  return {"failed", why};
}

#else

NaxStatus nax_prefill_status() { return {"unavailable", "the CPU backend has no tensor units"}; }

#endif

}  // namespace vllm_metal::metal
