// Test and benchmark hooks of the CPU runtime (bound in the extension's
// `debug` submodule, not part of the op API).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace vllm_metal {

// Force a (not wider than detected) instruction set, so tests can check every
// variant on one machine: "avx512", "avx2" or "generic".
void set_cpu_isa(const std::string& name);
// Turn the int8 matmuls' AMX tiles off or back on (raises where the CPU has none).
void set_cpu_amx(bool on);

// Runs one pool job of len(sleep_us) items, item i sleeping sleep_us[i]
// microseconds; returns how often each item ran and how many joins blocked
// (the caller outlasting its spin) during the call.
std::pair<std::vector<int>, long> pool_run(const std::vector<int>& sleep_us);

} // namespace vllm_metal
