#include "cpu/linear/row_argmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Columns per work item: a piece is read in a few microseconds, and a row of
// 49k logits (SmolLM2's vocab) splits into six, spread over both cores.
constexpr int64_t kPiece = 8192;

// The winner of a piece of a row: its first NaN, else its first maximum.
struct Best {
  float value;
  int64_t index;
  bool nan;
};

// Beats `b` when it comes first in mx.argmax's order (NaN first, then the
// larger value, ties to the smaller index).
bool before(const Best& a, const Best& b) {
  if (a.nan != b.nan) return a.nan;
  if (a.nan || a.value == b.value) return a.index < b.index;
  return a.value > b.value;
}

// x[0:n] of one row. Two vectorizable passes: the maximum and whether any
// value is NaN, then the first index holding the winner.
VLLM_METAL_INLINE Best piece_best(const float* x, int64_t n, int64_t offset) {
  float m = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  int64_t i = 0;
  if (nan) {
    while (!std::isnan(x[i])) ++i;
  } else {
    while (x[i] != m) ++i;   // -inf rows stop at 0
  }
  return {x[i], offset + i, nan != 0};
}

#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 Best piece_best_avx512(const float* x, int64_t n, int64_t offset) {
  return piece_best(x, n, offset);
}
VLLM_METAL_TARGET_AVX2 Best piece_best_avx2(const float* x, int64_t n, int64_t offset) {
  return piece_best(x, n, offset);
}
#endif

Best piece_best_dispatch(const float* x, int64_t n, int64_t offset) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return piece_best_avx512(x, n, offset);
    case Isa::Avx2: return piece_best_avx2(x, n, offset);
    default: break;
  }
#endif
  return piece_best(x, n, offset);
}

} // namespace

void row_argmax_cpu(const float* x, int64_t rows, int64_t ld, int64_t n, int32_t* out) {
  if (rows <= 0) return;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  std::vector<Best> best(static_cast<size_t>(rows * pieces));
  auto run = [&](int item) {
    const int64_t r = item / pieces, p = item % pieces;
    const int64_t c0 = p * kPiece, c1 = std::min(n, c0 + kPiece);
    best[item] = piece_best_dispatch(x + r * ld + c0, c1 - c0, c0);
  };
  const int64_t items = rows * pieces;
  if (items == 1) {
    run(0);
  } else {
    ThreadPool::instance().parallel_for(static_cast<int>(items), run);
  }
  for (int64_t r = 0; r < rows; ++r) {
    Best b = best[r * pieces];
    for (int64_t p = 1; p < pieces; ++p) {
      if (before(best[r * pieces + p], b)) b = best[r * pieces + p];
    }
    out[r] = static_cast<int32_t>(b.index);
  }
}

} // namespace vllm_metal::cpu
