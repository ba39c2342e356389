// Pipelines and dispatches of planned launches (compiled on Apple only).
#include "metal/launches.h"

#include <optional>
#include <stdexcept>
#include <string>

#include "kernel_constants.h"
#include "kv_quant.h"

#include "metal/kernel_library.h"

namespace vllm_metal::metal {

namespace mx = mlx::core;

namespace {

MTL::Library* load(mx::metal::Device& device, const KernelLibrary& library) {
  if (!library.path.empty()) return device.get_library(library.name, library.path);
  return device.get_library(library.name, [source = library.source] { return *source; });
}

MTL::Library* kernels_library(mx::metal::Device& device, const dispatch::KernelLaunch& launch) {
  if (!launch.tensor_ops) return load(device, configured_library());
  const std::optional<KernelLibrary> library = configured_tensor_library();
  if (!library) {
    throw std::runtime_error("vllm-metal: " + launch.kernel + " needs the tensor-op library, which is not loaded");
  }
  return load(device, *library);
}

// Pipeline of one planned launch, specialized by its function constants.
MTL::ComputePipelineState* specialized_pipeline(mx::metal::Device& device, const dispatch::KernelLaunch& launch) {
  if (!launch.specialized) return device.get_kernel(launch.kernel, kernels_library(device, launch));
  static const bool kFalse = false;
  static const bool kTrue = true;
  static const int kKvQuant[] = {0, 1, 2, 3, 4, 5};  // the values MTLFCList points at (KvQuant)
  static_assert(sizeof(kKvQuant) / sizeof(int) == kKvQuantLast + 1, "one value per KvQuant");
  if (launch.kv_quant < 0 || launch.kv_quant > kKvQuantLast) throw std::invalid_argument("kv_quant must be a KvQuant");
  mx::metal::MTLFCList constants;
  std::string hash = launch.kernel + "_fc";
  for (int i = 0; i < 4; ++i) {
    constants.emplace_back(launch.constants[i] ? &kTrue : &kFalse, MTL::DataType::DataTypeBool, NS::UInteger(i));
    hash += launch.constants[i] ? "1" : "0";
  }
  constants.emplace_back(&kKvQuant[launch.kv_quant], MTL::DataType::DataTypeInt,
                         NS::UInteger(VLLM_METAL_FC_KV_QUANT));
  hash += std::to_string(launch.kv_quant);
  return device.get_kernel(launch.kernel, kernels_library(device, launch), hash, constants);
}

}  // namespace

dispatch::KernelDtype kernel_dtype(mx::Dtype t) {
  if (t == mx::float16) return dispatch::KernelDtype::Float16;
  if (t == mx::bfloat16) return dispatch::KernelDtype::BFloat16;
  if (t == mx::float32) return dispatch::KernelDtype::Float32;
  return dispatch::KernelDtype::Unsupported;
}

MTL::ComputePipelineState* pipeline(mx::metal::Device& device, const dispatch::KernelLaunch& launch) {
  MTL::ComputePipelineState* state = specialized_pipeline(device, launch);
  dispatch::check_threadgroup_size(launch, state->maxTotalThreadsPerThreadgroup());
  return state;
}

void dispatch_launch(mx::metal::CommandEncoder& enc, const dispatch::KernelLaunch& launch) {
  enc.dispatch_threadgroups(MTL::Size(launch.grid[0], launch.grid[1], launch.grid[2]),
                            MTL::Size(launch.threads[0], launch.threads[1], launch.threads[2]));
}

}  // namespace vllm_metal::metal
