#include "dispatch/dispatch_env.h"

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "env_flag.h"
#include "platform.h"

#if VLLM_METAL_APPLE()
#include <CoreFoundation/CoreFoundation.h>
#include <IOKit/IOKitLib.h>
#endif

namespace vllm_metal::dispatch {

namespace {

#if VLLM_METAL_APPLE()
int probe_gpu_cores() {
  int cores = 0;
  io_iterator_t it = 0;
  if (IOServiceGetMatchingServices(kIOMainPortDefault, IOServiceMatching("AGXAccelerator"), &it) !=
      KERN_SUCCESS) {
    return 0;
  }
  // Test `cores` before taking the next entry: every entry taken is released.
  while (cores == 0) {
    const io_object_t service = IOIteratorNext(it);
    if (service == 0) break;
    CFTypeRef value = IORegistryEntryCreateCFProperty(service, CFSTR("gpu-core-count"), kCFAllocatorDefault, 0);
    if (value != nullptr) {
      if (CFGetTypeID(value) == CFNumberGetTypeID()) {
        CFNumberGetValue(static_cast<CFNumberRef>(value), kCFNumberIntType, &cores);
      }
      CFRelease(value);
    }
    IOObjectRelease(service);
  }
  IOObjectRelease(it);
  return cores;
}
#endif

// A route's A/B switch, read on every attention call (so one getenv): unset is
// off; anything but a boolean throws std::invalid_argument naming the variable.
bool env_switch(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) return false;
  if (const std::optional<bool> v = parse_flag(raw)) return *v;
  throw std::invalid_argument(std::string(name) + " must be a boolean (1/0/true/false), got '" + raw + "'");
}

}  // namespace

bool gqa_decode_disabled() {
  return env_switch("VLLM_METAL_DISABLE_GQA_DECODE");
}

bool nax_prefill_disabled() {
  return env_switch("VLLM_METAL_DISABLE_NAX_PREFILL");
}

int gpu_core_count() {
#if VLLM_METAL_APPLE()
  static const int cores = [] {
    int probed = probe_gpu_cores();
    return probed > 0 ? probed : kFallbackGpuCores;
  }();
  return cores;
#else
  return kFallbackGpuCores;
#endif
}

}  // namespace vllm_metal::dispatch
