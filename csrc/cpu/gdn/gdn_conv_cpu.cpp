// The short causal conv of Gated DeltaNet layers (gdn_cpu.h has the maths).
// Items are (request, block of channels): channels are independent, so an
// item walks its request's rows with the last K - 1 inputs of its channels in
// a ring, and writes them back as the new state at the end.
#include <algorithm>
#include <vector>

#include "cpu/gdn/gdn_cpu.h"
#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/isa.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Channels per item: a row of them is a few SIMD registers wide.
constexpr int kChannelBlock = 64;
// Below this many outputs (a decode step) the caller runs every item itself:
// waking the pool costs more than the work.
constexpr int64_t kParallelOutputs = 1 << 15;

struct Item {
  int seq;
  int c0, c1;
};

struct ConvScratch {
  ScratchVector<float> taps;  // [K, cb]: weight transposed, tap-major
  ScratchVector<float> ring;  // [K - 1, cb]: the last K - 1 inputs
  ScratchVector<float> row;   // [cb]: this row's inputs
  ScratchVector<float> acc;   // [cb]
  ScratchVector<float> wrow;  // [K]
};

VLLM_METAL_INLINE void conv_body(const ShortConvArgs& a, const Item& it, ConvScratch& w) {
  const int cb = it.c1 - it.c0, taps = a.kernel, keep = a.kernel - 1;
  const int64_t c = a.channels;
  w.taps.resize(static_cast<size_t>(taps) * cb);
  w.ring.resize(static_cast<size_t>(std::max(keep, 1)) * cb);
  w.row.resize(cb);
  w.acc.resize(cb);
  w.wrow.resize(taps);
  for (int i = 0; i < cb; ++i) {
    driver::load_row(a.weight, a.weight_type, (it.c0 + i) * static_cast<int64_t>(taps), taps,
                     w.wrow.data());
    for (int j = 0; j < taps; ++j) w.taps[static_cast<size_t>(j) * cb + i] = w.wrow[j];
  }
  float* state = a.lo + a.batch.slots[it.seq] * a.lo_width + a.conv_offset + it.c0;
  const bool from_state = a.batch.has_state[it.seq] != 0;
  for (int r = 0; r < keep; ++r) {
    float* dst = w.ring.data() + static_cast<size_t>(r) * cb;
    if (from_state) {
      std::copy(state + r * c, state + r * c + cb, dst);
    } else {
      std::fill(dst, dst + cb, 0.0f);  // the block's bytes are not a state: never read them
    }
  }
  int oldest = 0;  // ring row of z[t]
  float* acc = w.acc.data();
  const float* row = w.row.data();
  for (int64_t t = a.batch.cu_seqlens[it.seq]; t < a.batch.cu_seqlens[it.seq + 1]; ++t) {
    driver::load_row(a.x, a.x_type, t * c + it.c0, cb, w.row.data());
    std::fill(acc, acc + cb, 0.0f);
    for (int j = 0; j < keep; ++j) {
      const float* z = w.ring.data() + static_cast<size_t>((oldest + j) % keep) * cb;
      const float* tap = w.taps.data() + static_cast<size_t>(j) * cb;
#pragma omp simd
      for (int i = 0; i < cb; ++i) acc[i] += tap[i] * z[i];
    }
    const float* last = w.taps.data() + static_cast<size_t>(keep) * cb;
#pragma omp simd
    for (int i = 0; i < cb; ++i) acc[i] += last[i] * row[i];
    driver::store_row(acc, nullptr, cb, a.y, a.y_type, t * c + it.c0);
    if (keep > 0) {
      std::copy(row, row + cb, w.ring.data() + static_cast<size_t>(oldest) * cb);
      oldest = (oldest + 1) % keep;
    }
  }
  for (int r = 0; r < keep; ++r) {
    const float* src = w.ring.data() + static_cast<size_t>((oldest + r) % keep) * cb;
    std::copy(src, src + cb, state + r * c);
  }
}

void conv_generic(const ShortConvArgs& a, const Item& it, ConvScratch& w) {
  conv_body(a, it, w);
}
#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void conv_avx512(const ShortConvArgs& a, const Item& it, ConvScratch& w) {
  conv_body(a, it, w);
}
VLLM_METAL_TARGET_AVX2 void conv_avx2(const ShortConvArgs& a, const Item& it, ConvScratch& w) {
  conv_body(a, it, w);
}
#endif

void run_item(const ShortConvArgs& a, const Item& it, ConvScratch& w) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return conv_avx512(a, it, w);
    case Isa::Avx2: return conv_avx2(a, it, w);
    default: break;
  }
#endif
  conv_generic(a, it, w);
}

} // namespace

void short_conv_cpu(const ShortConvArgs& a) {
  check_gdn_batch("gdn_short_conv", a.batch);
  if (a.channels == 0) return;
  std::vector<Item> items;
  for (int n = 0; n < a.batch.num_seqs; ++n) {
    for (int c0 = 0; c0 < a.channels; c0 += kChannelBlock) {
      items.push_back({n, c0, std::min(a.channels, c0 + kChannelBlock)});
    }
  }
  auto run = [&](int i) {
    thread_local ConvScratch w;
    run_item(a, items[i], w);
  };
  if (a.batch.total_rows * a.channels < kParallelOutputs) {
    for (int i = 0; i < static_cast<int>(items.size()); ++i) run(i);
  } else {
    ThreadPool::instance().parallel_for(static_cast<int>(items.size()), run);
  }
}

} // namespace vllm_metal::cpu
