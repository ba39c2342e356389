#include "cpu/sampling/sample_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/runtime/isa.h"
#include "cpu/sampling/sample_filters.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Weights are summed per block, so the scan after the draw reads one block.
constexpr int64_t kBlock = 512;

// First i with x[i] == value (n if none): a vectorized test per block, then
// a scalar look inside the block that has it.
VLLM_METAL_INLINE int64_t first_equal(const float* __restrict x, int64_t n, float value) {
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (int64_t i = b; i < e; ++i) hit |= x[i] == value;
    if (hit) {
      for (int64_t i = b; i < e; ++i) {
        if (x[i] == value) return i;
      }
    }
  }
  return n;
}

// w[i] = 2^((x[i] - m) * c) <= 1 (0 for -inf), sums[b] = the sum of block b.
VLLM_METAL_INLINE void block_weights(const float* __restrict x, int64_t n, float m, float c,
                                     float* __restrict w, double* __restrict sums) {
  for (int64_t b = 0, k = 0; b < n; b += kBlock, ++k) {
    const int64_t e = std::min(n, b + kBlock);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      const float v = exp2_nonpositive((x[i] - m) * c);
      w[i] = v;
      s += v;
    }
    sums[k] = s;
  }
}

// The smallest i whose running weight exceeds target, walking the block sums
// first. Rounding can leave the target just past the end of a block (or of
// the row): the last positive weight there is taken.
int64_t invert_cdf(const float* w, const double* sums, int64_t n, double target) {
  auto last_positive = [w, n](int64_t b) {
    for (int64_t i = std::min(n, b + kBlock) - 1; i >= b; --i) {
      if (w[i] > 0.0f) return i;
    }
    return int64_t{-1};
  };
  double acc = 0.0;
  int64_t last_block = -1;   // the last block passed that holds weight
  for (int64_t b = 0, k = 0; b < n; b += kBlock, ++k) {
    if (acc + sums[k] <= target) {
      acc += sums[k];
      if (sums[k] > 0.0) last_block = b;
      continue;
    }
    for (int64_t i = b; i < std::min(n, b + kBlock); ++i) {
      acc += w[i];
      if (acc > target && w[i] > 0.0f) return i;
    }
    return last_positive(b);
  }
  return last_block < 0 ? -1 : last_positive(last_block);
}

// w[i] = 0 where w[i] < floor, and the block sums again.
VLLM_METAL_INLINE void apply_floor(float* __restrict w, int64_t n, float floor,
                                   double* __restrict sums) {
  for (int64_t b = 0, k = 0; b < n; b += kBlock, ++k) {
    const int64_t e = std::min(n, b + kBlock);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b; i < e; ++i) {
      const float v = w[i] >= floor ? w[i] : 0.0f;
      w[i] = v;
      s += v;
    }
    sums[k] = s;
  }
}

// out[i] = x[i] where bit i of bits is set, else -inf.
VLLM_METAL_INLINE void mask_row(const float* __restrict x, const uint32_t* __restrict bits,
                                int64_t n, float* __restrict out) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = (bits[i >> 5] >> (i & 31)) & 1u ? x[i] : kNegInf;
}

struct Scratch {
  std::vector<float> masked;   // the row under its grammar's bitmask
  std::vector<float> weights;
  std::vector<double> sums;
  SelectScratch select;
};

// One row's filters: min_p <= 0, top_k outside [1, vocab), top_p >= 1 are off.
struct RowFilters {
  float min_p = 0.0f;
  int64_t top_k = 0;
  float top_p = 1.0f;

  bool active(int64_t n) const {
    return min_p > 0.0f || (top_k > 0 && top_k < n) || top_p < 1.0f;
  }
};

double sum_of(const double* sums, int64_t blocks) {
  double total = 0.0;
  for (int64_t k = 0; k < blocks; ++k) total += sums[k];
  return total;
}

// The one floor on the weights that min_p, then top-k, then top-p amount to
// (each acts on what the one before kept; the weights' max is 1).
float filter_floor(const float* w, const double* sums, int64_t n, const RowFilters& f,
                   SelectScratch& scratch) {
  float floor = f.min_p > 0.0f ? f.min_p : 0.0f;
  if (f.top_k > 0 && f.top_k < n) {
    floor = std::max(floor, kth_largest_weight(w, n, floor, f.top_k, scratch));
  }
  if (f.top_p < 1.0f) {
    double mass = 0.0;
    if (floor > 0.0f) {
      for (int64_t i = 0; i < n; ++i) mass += w[i] >= floor ? w[i] : 0.0f;
    } else {
      mass = sum_of(sums, (n + kBlock - 1) / kBlock);
    }
    floor = std::max(floor, top_p_cutoff(w, n, floor, mass, f.top_p, scratch));
  }
  return floor;
}

// One row (bits: its bitmask, or null); every pass is inlined into the per-ISA
// copies below.
VLLM_METAL_INLINE int32_t sample_row(const float* x, const uint32_t* bits, int64_t n,
                                     float temperature, double u, const RowFilters& filters,
                                     Scratch& scratch) {
  if (bits != nullptr) {
    scratch.masked.resize(n);
    mask_row(x, bits, n, scratch.masked.data());
    x = scratch.masked.data();
  }
  const float m = row_max(x, n);
  if (std::isnan(m) || m == -std::numeric_limits<float>::infinity()) {
    return 0;   // nothing to draw from: every logit is -inf or NaN
  }
  constexpr float kLog2e = 1.4426950408889634f;
  const float c = kLog2e / temperature;
  if (!(temperature > 0.0f) || std::isinf(m) || !std::isfinite(c)) {
    return static_cast<int32_t>(first_equal(x, n, m));
  }
  scratch.weights.resize(n);
  scratch.sums.resize((n + kBlock - 1) / kBlock);
  block_weights(x, n, m, c, scratch.weights.data(), scratch.sums.data());
  if (filters.active(n)) {
    const float floor =
        filter_floor(scratch.weights.data(), scratch.sums.data(), n, filters, scratch.select);
    apply_floor(scratch.weights.data(), n, floor, scratch.sums.data());
  }
  const double total = sum_of(scratch.sums.data(), static_cast<int64_t>(scratch.sums.size()));
  if (!(total > 0.0) || !std::isfinite(total)) {
    return static_cast<int32_t>(first_equal(x, n, m));
  }
  const int64_t i = invert_cdf(scratch.weights.data(), scratch.sums.data(), n, u * total);
  return static_cast<int32_t>(i >= 0 ? i : first_equal(x, n, m));
}

#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 int32_t sample_row_avx512(const float* x, const uint32_t* b, int64_t n,
                                                   float t, double u, const RowFilters& f,
                                                   Scratch& s) {
  return sample_row(x, b, n, t, u, f, s);
}
VLLM_METAL_TARGET_AVX2 int32_t sample_row_avx2(const float* x, const uint32_t* b, int64_t n,
                                               float t, double u, const RowFilters& f,
                                               Scratch& s) {
  return sample_row(x, b, n, t, u, f, s);
}
#endif

int32_t sample_row_dispatch(const float* x, const uint32_t* b, int64_t n, float t, double u,
                            const RowFilters& f, Scratch& s) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return sample_row_avx512(x, b, n, t, u, f, s);
    case Isa::Avx2: return sample_row_avx2(x, b, n, t, u, f, s);
    default: break;
  }
#endif
  return sample_row(x, b, n, t, u, f, s);
}

} // namespace

double key_uniform(uint32_t high, uint32_t low) {
  uint64_t z = (static_cast<uint64_t>(high) << 32 | low) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

void sample_rows_cpu(const float* logits, int64_t rows, int64_t vocab,
                     const float* temperature, const uint32_t* keys,
                     const SampleFilters& filters, int32_t* out) {
  auto row = [&](int r) {
    thread_local Scratch scratch;
    RowFilters f;
    if (filters.min_p != nullptr) f.min_p = filters.min_p[r];
    if (filters.top_k != nullptr) f.top_k = filters.top_k[r];
    if (filters.top_p != nullptr) f.top_p = filters.top_p[r];
    const uint32_t* bits =
        filters.allowed != nullptr ? filters.allowed + r * filters.allowed_ld : nullptr;
    out[r] = sample_row_dispatch(logits + r * vocab, bits, vocab, temperature[r],
                                 key_uniform(keys[2 * r], keys[2 * r + 1]), f, scratch);
  };
  if (rows == 1) {
    row(0);
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(rows), row);
}

} // namespace vllm_metal::cpu
