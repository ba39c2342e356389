#include "cpu/activation/activation_cpu.h"

#include <algorithm>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu {

namespace {

// Below this many elements a call runs on the calling thread.
constexpr int64_t kParallelElems = 1 << 16;

template <Activation A>
VLLM_METAL_INLINE void span(const float* x, float* out, int64_t n) {
  activation_span<A, false>(x, nullptr, out, n);
}

VLLM_METAL_INLINE void span_of(Activation act, const float* x, float* out, int64_t n) {
  switch (act) {
    case Activation::Silu: return span<Activation::Silu>(x, out, n);
    case Activation::GeluTanh: return span<Activation::GeluTanh>(x, out, n);
    case Activation::GeluFast: return span<Activation::GeluFast>(x, out, n);
    default: return span<Activation::Gelu>(x, out, n);
  }
}

// One body, compiled per instruction set (this file is built for the baseline ISA).
#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void span_avx512(Activation act, const float* x, float* out,
                                          int64_t n) {
  span_of(act, x, out, n);
}
VLLM_METAL_TARGET_AVX2 void span_avx2(Activation act, const float* x, float* out, int64_t n) {
  span_of(act, x, out, n);
}
#endif

void span_range(Activation act, const float* x, float* out, int64_t n) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return span_avx512(act, x, out, n);
    case Isa::Avx2: return span_avx2(act, x, out, n);
    default: break;
  }
#endif
  span_of(act, x, out, n);
}

} // namespace

void activation_cpu(Activation act, const float* x, float* out, int64_t n) {
  const int threads = ThreadPool::instance().size();
  if (n < kParallelElems || threads < 2) {
    span_range(act, x, out, n);
    return;
  }
  // Chunks of whole cache lines, a few per thread.
  const int64_t items = std::min<int64_t>(4 * threads, n / 4096);
  const int64_t per = ((n + items - 1) / items + 15) / 16 * 16;
  parallel_ranges(items, static_cast<int>(items), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = i * per, b = std::min(n, a + per);
      if (a < b) span_range(act, x + a, out + a, b - a);
    }
  });
}

} // namespace vllm_metal::cpu
