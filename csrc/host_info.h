// What production asks the extension about the host it runs on (not op API:
// facts for logs, the memory budget and huge-page advice).
#pragma once

#include <cstdint>
#include <string>

#include "mlx/array.h"

namespace vllm_metal {

// Address of the first element of an evaluated array: the CPU backend advises
// the pages of the weights and the KV cache (huge pages) by address.
std::uintptr_t data_ptr(const mlx::core::array& a);

// Name of the instruction set the CPU kernels dispatch to.
std::string cpu_isa();

// Whether the int8-activation matmuls use AMX tiles (cpu::amx_active).
bool cpu_amx();

// Threads the CPU kernel pool uses (including the calling thread).
int cpu_threads();

} // namespace vllm_metal
