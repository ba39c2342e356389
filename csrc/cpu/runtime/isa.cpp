#include "cpu/runtime/isa.h"

#include <atomic>
#include <stdexcept>

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
