// Run-time choice of the instruction set for the CPU kernels.
//
// Wheels must run on any CPU of the architecture, so nothing is compiled with
// -march=native; hot code is compiled once per ISA (target attributes) and the
// widest one the CPU and OS support is picked at run time.
#pragma once

#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define VLLM_METAL_X86_DISPATCH 1
#define VLLM_METAL_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define VLLM_METAL_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")))
#else
#define VLLM_METAL_X86_DISPATCH 0
#endif

namespace vllm_metal::cpu {

enum class Isa { Generic = 0, Avx2 = 1, Avx512 = 2 };

// Widest ISA this CPU supports (cached after the first call).
Isa detected_isa();

// ISA the kernels currently use: detected_isa() unless lowered for testing.
Isa active_isa();

// Lower the ISA (tests); raises std::invalid_argument if the CPU lacks it.
void set_active_isa(Isa isa);

Isa parse_isa(const std::string& name);

const char* isa_name(Isa isa);

// AMX tiles for the int8-activation matmuls (linear_q8.h): this CPU has
// AMX-TILE and AMX-INT8 and Linux granted the process the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM), cached after the first call.
bool amx_available();
// Whether they are used: available, the active ISA is avx512 (AMX sits beside
// the VNNI kernel), VLLM_METAL_CPU_AMX is not 0, and tests have not turned it off.
bool amx_active();
// Turn AMX off or back on (tests, A/B); raises std::invalid_argument when turning
// it on where amx_available() is false.
void set_amx_active(bool on);

} // namespace vllm_metal::cpu
