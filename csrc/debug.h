// Introspection helpers for tests and diagnostics (not part of the op API).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"

namespace vllm_metal {

// Address of the first element of an evaluated array; lets tests prove that
// reshape_and_cache writes into the cache buffer instead of a copy.
std::uintptr_t data_ptr(const mlx::core::array& a);

// Name of the instruction set the CPU kernels dispatch to.
std::string cpu_isa();

// Force a (not wider than detected) instruction set, so tests can check every
// variant on one machine: "avx512", "avx2" or "generic".
void set_cpu_isa(const std::string& name);

// Threads the CPU kernel pool uses (including the calling thread).
int cpu_threads();

// Runs one pool job of len(sleep_us) items, item i sleeping sleep_us[i]
// microseconds; returns how often each item ran and how many joins blocked
// (the caller outlasting its spin) during the call.
std::pair<std::vector<int>, long> pool_run(const std::vector<int>& sleep_us);

} // namespace vllm_metal
