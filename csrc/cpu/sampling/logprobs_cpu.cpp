#include "cpu/sampling/logprobs_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
// Up to this k the top scores are kept in a small sorted buffer during one
// scan; beyond it (prompt logprobs of the whole vocab) they are sorted.
constexpr int64_t kSmallK = 64;

// logsumexp in float32, its sum accumulated in double per block of 1024.
VLLM_METAL_INLINE float logsumexp_span(const float* __restrict x, int64_t n) {
  const float m = row_max(x, n);
  if (!std::isfinite(m)) return m;
  constexpr float kLog2e = 1.4426950408889634f;
  double sum = 0.0;
  for (int64_t b = 0; b < n; b += 1024) {
    const int64_t e = std::min(n, b + 1024);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) s += exp2_nonpositive((x[i] - m) * kLog2e);
    sum += s;
  }
  return m + static_cast<float>(std::log(sum));
}

// One body, compiled per instruction set (cpu/runtime/isa.h).
#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 float logsumexp_avx512(const float* x, int64_t n) {
  return logsumexp_span(x, n);
}
VLLM_METAL_TARGET_AVX2 float logsumexp_avx2(const float* x, int64_t n) {
  return logsumexp_span(x, n);
}
#endif

float logsumexp(const float* x, int64_t n) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return logsumexp_avx512(x, n);
    case Isa::Avx2: return logsumexp_avx2(x, n);
    default: break;
  }
#endif
  return logsumexp_span(x, n);
}

// True when (a, ia) comes before (b, ib): higher score first, then lower id.
inline bool before(float a, int64_t ia, float b, int64_t ib) {
  return a > b || (a == b && ia < ib);
}

// Ordered by x itself, not by the scores x - shift: rounding the subtraction
// would tie neighbours that x tells apart.
void top_k_scores(const float* x, int64_t n, float shift, int64_t k, int32_t* ids,
                  float* vals) {
  const int64_t kk = std::min(k, n);
  std::vector<std::pair<float, int64_t>> top;
  if (kk == 0) {
    return;
  } else if (kk <= kSmallK) {
    top.reserve(kk + 1);
    for (int64_t i = 0; i < n; ++i) {
      const float s = x[i];
      if (static_cast<int64_t>(top.size()) == kk &&
          !before(s, i, top.back().first, top.back().second)) {
        continue;
      }
      auto at = std::upper_bound(top.begin(), top.end(), std::make_pair(s, i),
                                 [](const auto& a, const auto& b) {
                                   return before(a.first, a.second, b.first, b.second);
                                 });
      top.insert(at, {s, i});
      if (static_cast<int64_t>(top.size()) > kk) top.pop_back();
    }
  } else {
    top.resize(n);
    for (int64_t i = 0; i < n; ++i) top[i] = {x[i], i};
    std::partial_sort(top.begin(), top.begin() + kk, top.end(),
                      [](const auto& a, const auto& b) {
                        return before(a.first, a.second, b.first, b.second);
                      });
  }
  for (int64_t j = 0; j < k; ++j) {
    const bool real = j < kk;
    ids[j] = real ? static_cast<int32_t>(top[j].second) : 0;
    vals[j] = real ? top[j].first - shift : -kInf;
  }
}

} // namespace

void top_logprobs_cpu(const float* x, int64_t rows, int64_t vocab, const int32_t* token,
                      int64_t k, bool normalize, int32_t* ids, float* vals, int32_t* ranks) {
  for (int64_t r = 0; r < rows; ++r) {
    if (token[r] < 0 || token[r] >= vocab) {
      throw std::out_of_range("top_logprobs: token[" + std::to_string(r) + "] = " +
                              std::to_string(token[r]) + " is outside [0, " +
                              std::to_string(vocab) + ")");
    }
  }
  auto row = [&](int r) {
    const float* xr = x + r * vocab;
    const float shift = normalize ? logsumexp(xr, vocab) : 0.0f;
    const float chosen = xr[token[r]];
    int32_t count = 0;
#pragma omp simd reduction(+ : count)
    for (int64_t i = 0; i < vocab; ++i) count += xr[i] >= chosen;
    ranks[r] = count;
    int32_t* id_row = ids + r * (k + 1);
    float* val_row = vals + r * (k + 1);
    id_row[0] = token[r];
    val_row[0] = chosen - shift;
    top_k_scores(xr, vocab, shift, k, id_row + 1, val_row + 1);
  };
  if (rows == 1) {
    row(0);
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(rows), row);
}

} // namespace vllm_metal::cpu
