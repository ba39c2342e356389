#include "cpu/norm_rope/norm_rope_cpu.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Below this many elements a call runs on the calling thread: waking the
// pool costs more than the work (a decode step's norms are ~1-10k elements).
constexpr int64_t kParallelElems = 1 << 16;

// fn over [0, n) rows, split over the pool only past kParallelElems elements.
void for_chunks(int64_t n, int64_t elems_per_item,
                const std::function<void(int64_t, int64_t)>& fn) {
  const int threads = ThreadPool::instance().size();
  const bool parallel = n * elems_per_item >= kParallelElems && threads > 1;
  parallel_ranges(n, parallel ? static_cast<int>(std::min<int64_t>(n, 4 * threads)) : 1, fn);
}

template <typename S>
VLLM_METAL_INLINE float load(const void* p, int64_t i) {
  return S::to_float(static_cast<const typename S::storage*>(p)[i]);
}

template <typename S>
VLLM_METAL_INLINE void store(void* p, int64_t i, float v) {
  static_cast<typename S::storage*>(p)[i] = S::from_float(v);
}

template <typename SX, typename SW, typename SO>
void rms_norm_rows(const RmsNormArgs& a, int64_t r0, int64_t r1) {
  const int64_t d = a.d;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * d;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) {
      const float v = load<SX>(a.x, base + j);
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + a.eps);
    if (a.w == nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) store<SO>(a.out, base + j, load<SX>(a.x, base + j) * inv);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        store<SO>(a.out, base + j, load<SX>(a.x, base + j) * inv * load<SW>(a.w, j));
      }
    }
  }
}

template <typename SX, typename SW>
void rms_norm_out(const RmsNormArgs& a, int64_t r0, int64_t r1) {
  switch (a.out_type) {
    case Elem::F32: return rms_norm_rows<SX, SW, F32>(a, r0, r1);
    case Elem::BF16: return rms_norm_rows<SX, SW, BF16>(a, r0, r1);
    case Elem::F16: return rms_norm_rows<SX, SW, F16>(a, r0, r1);
  }
}

template <typename SX>
void rms_norm_w(const RmsNormArgs& a, int64_t r0, int64_t r1) {
  switch (a.w == nullptr ? a.x_type : a.w_type) {
    case Elem::F32: return rms_norm_out<SX, F32>(a, r0, r1);
    case Elem::BF16: return rms_norm_out<SX, BF16>(a, r0, r1);
    case Elem::F16: return rms_norm_out<SX, F16>(a, r0, r1);
  }
}

void rms_norm_range(const RmsNormArgs& a, int64_t r0, int64_t r1) {
  switch (a.x_type) {
    case Elem::F32: return rms_norm_w<F32>(a, r0, r1);
    case Elem::BF16: return rms_norm_w<BF16>(a, r0, r1);
    case Elem::F16: return rms_norm_w<F16>(a, r0, r1);
  }
}

// cos/sin of one position's angles. The angle is formed and reduced modulo
// 2*pi in double, so long contexts (position ~1e5) keep full float accuracy.
void angles(const RopeArgs& a, const std::vector<double>& inv_freq, int64_t pos, float* cs,
            float* sn) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double p = static_cast<double>(pos) * a.scale;
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double theta = std::fmod(p * inv_freq[i], kTwoPi);
    cs[i] = static_cast<float>(std::cos(theta));
    sn[i] = static_cast<float>(std::sin(theta));
  }
}

template <typename S>
void rope_rows(const RopeArgs& a, const std::vector<double>& inv_freq, int64_t row0,
               int64_t row1) {
  // A row is one (bi, li): its angles are shared by the m heads.
  const int half = a.dims / 2;
  std::vector<float> cs_row(half), sn_row(half);
  const int64_t stride_m = a.l * a.d;
  for (int64_t row = row0; row < row1; ++row) {
    const int64_t bi = row / a.l, li = row % a.l;
    const float* cs = cs_row.data();
    const float* sn = sn_row.data();
    if (a.cos_table != nullptr) {
      cs = a.cos_table + row * half;
      sn = a.sin_table + row * half;
    } else {
      const int64_t pos = static_cast<int64_t>(a.offsets[a.num_offsets == 1 ? 0 : bi]) + li;
      angles(a, inv_freq, pos, cs_row.data(), sn_row.data());
    }
    for (int64_t mi = 0; mi < a.m; ++mi) {
      const int64_t base = (bi * a.m + mi) * stride_m + li * a.d;
      const int64_t s1 = a.traditional ? 1 : half;   // distance to the pair's partner
      const int64_t step = a.traditional ? 2 : 1;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const int64_t j = base + i * step;
        const float x1 = load<S>(a.x, j), x2 = load<S>(a.x, j + s1);
        store<S>(a.out, j, x1 * cs[i] - x2 * sn[i]);
        store<S>(a.out, j + s1, x1 * sn[i] + x2 * cs[i]);
      }
      for (int64_t j = a.dims; j < a.d; ++j) store<S>(a.out, base + j, load<S>(a.x, base + j));
    }
  }
}

std::vector<double> inverse_frequencies(const RopeArgs& a) {
  const int half = a.dims / 2;
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = a.freqs != nullptr
        ? 1.0 / static_cast<double>(a.freqs[i])
        : std::pow(a.base, -2.0 * i / static_cast<double>(a.dims));
  }
  return inv_freq;
}

} // namespace

void rope_table_cpu(const RopeArgs& a, float* cos_table, float* sin_table) {
  const std::vector<double> inv_freq = inverse_frequencies(a);
  const int64_t half = a.dims / 2;
  for_chunks(a.b * a.l, half * 16, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      const int64_t bi = row / a.l, li = row % a.l;
      const int64_t pos = static_cast<int64_t>(a.offsets[a.num_offsets == 1 ? 0 : bi]) + li;
      angles(a, inv_freq, pos, cos_table + row * half, sin_table + row * half);
    }
  });
}

void rms_norm_cpu(const RmsNormArgs& a) {
  for_chunks(a.rows, a.d, [&](int64_t r0, int64_t r1) { rms_norm_range(a, r0, r1); });
}

void rope_cpu(const RopeArgs& a) {
  // With a table the angles are already formed.
  const std::vector<double> inv_freq =
      a.cos_table != nullptr ? std::vector<double>{} : inverse_frequencies(a);
  for_chunks(a.b * a.l, a.m * a.d, [&](int64_t r0, int64_t r1) {
    switch (a.type) {
      case Elem::F32: return rope_rows<F32>(a, inv_freq, r0, r1);
      case Elem::BF16: return rope_rows<BF16>(a, inv_freq, r0, r1);
      case Elem::F16: return rope_rows<F16>(a, inv_freq, r0, r1);
    }
  });
}

} // namespace vllm_metal::cpu
