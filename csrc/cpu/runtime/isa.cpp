#include "cpu/runtime/isa.h"

#include <atomic>
#include <string>
#include <stdexcept>

#if VLLM_METAL_X86_DISPATCH
#include <cpuid.h>
#endif
#if VLLM_METAL_X86_DISPATCH && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "env_flag.h"

namespace vllm_metal::cpu {

namespace {

Isa probe_isa() {
#if VLLM_METAL_X86_DISPATCH
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return Isa::Avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::Avx2;
  }
#endif
  return Isa::Generic;
}

std::atomic<int> g_active{-1};

bool probe_amx() {
#if VLLM_METAL_X86_DISPATCH && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;
  if ((d & kAmxTile) == 0 || (d & kAmxInt8) == 0) return false;
  // Linux hands out the 8 KiB tile state only on request (once per process, for
  // every thread); without it the first tile instruction raises SIGILL.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
#else
  return false;
#endif
}

// VLLM_METAL_CPU_AMX with the values vllm_metal/envs.py accepts (it refuses
// others at startup): unset means on.
bool amx_env_allows() {
  return env_flag("VLLM_METAL_CPU_AMX").value_or(true);
}

std::atomic<bool> g_amx_on{true};

} // namespace

Isa detected_isa() {
  static const Isa isa = probe_isa();
  return isa;
}

Isa active_isa() {
  int v = g_active.load(std::memory_order_relaxed);
  return v < 0 ? detected_isa() : static_cast<Isa>(v);
}

void set_active_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) {
    throw std::invalid_argument(
        std::string("isa: this CPU does not support ") + isa_name(isa) +
        " (widest available: " + isa_name(detected_isa()) + ")");
  }
  g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
}

bool amx_available() {
  static const bool ok = probe_amx();
  return ok;
}

bool amx_active() {
  static const bool allowed = amx_env_allows();
  return allowed && g_amx_on.load(std::memory_order_relaxed) && amx_available() &&
      active_isa() == Isa::Avx512;
}

void set_amx_active(bool on) {
  if (on && !amx_available()) {
    throw std::invalid_argument("amx: this CPU or OS offers no AMX-INT8 tiles");
  }
  g_amx_on.store(on, std::memory_order_relaxed);
}

Isa parse_isa(const std::string& name) {
  if (name == "avx512") return Isa::Avx512;
  if (name == "avx2") return Isa::Avx2;
  if (name == "generic") return Isa::Generic;
  throw std::invalid_argument(
      "isa: expected 'avx512', 'avx2' or 'generic', got '" + name + "'");
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    default:
      return "generic";
  }
}

} // namespace vllm_metal::cpu
