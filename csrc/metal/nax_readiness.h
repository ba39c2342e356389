// Whether the NaxPrefill route (Metal 4 tensor ops, kernels_v2/paged_attention_
// nax_prefill.h) can run on this machine. The route needs three things only a
// Mac can tell: tensor units, a tensor-op library that loads (or compiles), and
// pipelines that build; each missing one leaves the other routes serving.
#pragma once

#include <string>

#include "platform.h"

#if VLLM_METAL_APPLE()
#include "dispatch/metal_launch_plan.h"
#include "mlx/backend/metal/device.h"
#endif

namespace vllm_metal::metal {

struct NaxStatus {
  // "ready"; "unavailable": the machine cannot run the route (no tensor units:
  // the CPU backend, or by MLX's own test a GPU before M5 or macOS before 26.2;
  // or no tensor-op library: this build's Metal toolchain has no Metal 4);
  // "failed": the library or its pipeline failed to load or compile (a bug).
  std::string state;
  std::string detail;
};

// On a Mac with tensor units this loads the library and builds a pipeline
// (vllm-metal doctor).
NaxStatus nax_prefill_status();

#if VLLM_METAL_APPLE()
// The GPU has tensor units and a tensor-op library is configured (cheap: eval_gpu
// asks it on every call).
bool tensor_units_available();

// Whether `launch`, a tensor-op kernel, can run: its library loads or compiles,
// its pipeline builds, and the pipeline takes the launch's threads. Cached per
// library and pipeline; the first failure of each is written to stderr with its
// reason, and the caller takes another route.
bool tensor_launch_ready(mlx::core::metal::Device& device, const dispatch::KernelLaunch& launch);
#endif

}  // namespace vllm_metal::metal
