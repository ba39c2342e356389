// Inputs of the dispatch decision that come from the machine or environment.
#pragma once

namespace vllm_metal::dispatch {

// GPU cores assumed when the IORegistry cannot be read (the smallest M-series
// GPUs have 7-10 cores): a low count only makes the split heuristics split sooner.
inline constexpr int kFallbackGpuCores = 8;

// VLLM_METAL_DISABLE_GQA_DECODE: 1/true/yes/on disables the GQA decode route,
// 0/false/no/off/unset keeps it; anything else throws std::invalid_argument.
bool gqa_decode_disabled();

// VLLM_METAL_DISABLE_NAX_PREFILL: the same for the NaxPrefill route (an A/B switch).
bool nax_prefill_disabled();

// GPU cores from the IORegistry ("gpu-core-count" of the AGXAccelerator) on
// macOS, probed once; kFallbackGpuCores when unavailable (and on Linux).
int gpu_core_count();

}  // namespace vllm_metal::dispatch
