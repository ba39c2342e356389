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
// 49k logits (SmolLM2's vocab) splits into six, spread over both cores. A
// multiple of 32: a piece starts at a bitmask word.
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

// x[c] where bit c of bits is set, else -inf.
VLLM_METAL_INLINE float admitted(const float* x, const uint32_t* bits, int64_t c) {
  return (bits[c >> 5] >> (c & 31)) & 1u ? x[c] : -std::numeric_limits<float>::infinity();
}

// piece_best of x[0:n] with the columns bits does not admit at -inf; offset is
// a multiple of 32 (bits starts at the piece's first column).
VLLM_METAL_INLINE Best piece_best_masked(const float* x, const uint32_t* bits, int64_t n,
                                         int64_t offset) {
  float m = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < n; ++i) {
    const float v = admitted(x, bits, i);
    m = v > m ? v : m;
    nan |= v != v;
  }
  int64_t i = 0;
  if (nan) {
    while (!std::isnan(admitted(x, bits, i))) ++i;
  } else {
    while (admitted(x, bits, i) != m) ++i;   // -inf pieces stop at 0
  }
  return {admitted(x, bits, i), offset + i, nan != 0};
}

Best piece_best_any(const float* x, const uint32_t* bits, int64_t n, int64_t offset) {
  return bits != nullptr ? piece_best_masked(x, bits, n, offset) : piece_best(x, n, offset);
}

#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 Best piece_best_avx512(const float* x, const uint32_t* bits, int64_t n,
                                                int64_t offset) {
  return piece_best_any(x, bits, n, offset);
}
VLLM_METAL_TARGET_AVX2 Best piece_best_avx2(const float* x, const uint32_t* bits, int64_t n,
                                            int64_t offset) {
  return piece_best_any(x, bits, n, offset);
}
#endif

Best piece_best_dispatch(const float* x, const uint32_t* bits, int64_t n, int64_t offset) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return piece_best_avx512(x, bits, n, offset);
    case Isa::Avx2: return piece_best_avx2(x, bits, n, offset);
    default: break;
  }
#endif
  return piece_best_any(x, bits, n, offset);
}

} // namespace

void row_argmax_cpu(const float* x, int64_t rows, int64_t ld, int64_t n, int32_t* out,
                    const uint32_t* allowed, int64_t allowed_ld) {
  if (rows <= 0) return;
  const int64_t pieces = (n + kPiece - 1) / kPiece;
  std::vector<Best> best(static_cast<size_t>(rows * pieces));
  auto run = [&](int item) {
    const int64_t r = item / pieces, p = item % pieces;
    const int64_t c0 = p * kPiece, c1 = std::min(n, c0 + kPiece);
    const uint32_t* bits = allowed != nullptr ? allowed + r * allowed_ld + c0 / 32 : nullptr;
    best[item] = piece_best_dispatch(x + r * ld + c0, bits, c1 - c0, c0);
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
