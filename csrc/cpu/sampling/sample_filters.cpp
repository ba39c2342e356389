#include "cpu/sampling/sample_filters.h"

#include <cstring>
#include <limits>

namespace vllm_metal::cpu {

namespace {

// Radix levels over a positive float's bits: the exponent (the sign bit is
// 0), then the top 12 and the low 11 bits of the mantissa. After the last
// level every candidate left has the same bits.
struct Level {
  int shift;
  uint32_t mask;
};
constexpr Level kLevels[] = {{23, 0xFF}, {11, 0xFFF}, {0, 0x7FF}};
constexpr int kMaxBuckets = 0x1000;

inline uint32_t bucket(float v, const Level& l) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u >> l.shift) & l.mask;
}

// The weights >= floor and > 0, copied into `out`; returns how many.
int64_t gather(const float* w, int64_t n, float floor, std::vector<float>& out) {
  const float lo = floor > 0.0f ? floor : std::numeric_limits<float>::denorm_min();
  out.resize(n);
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    out[m] = w[i];
    m += w[i] >= lo;
  }
  return m;
}

// Keep the first m values that fall in bucket b of level l; returns the count.
int64_t keep_bucket(std::vector<float>& c, int64_t m, const Level& l, uint32_t b) {
  int64_t j = 0;
  for (int64_t i = 0; i < m; ++i) {
    c[j] = c[i];
    j += bucket(c[i], l) == b;
  }
  return j;
}

} // namespace

float kth_largest_weight(const float* w, int64_t n, float floor, int64_t k,
                         SelectScratch& scratch) {
  auto& c = scratch.candidates;
  int64_t m = gather(w, n, floor, c);
  if (m <= k) return floor;   // k or fewer qualify: top-k removes nothing
  for (const Level& l : kLevels) {
    int64_t counts[kMaxBuckets] = {};
    for (int64_t i = 0; i < m; ++i) ++counts[bucket(c[i], l)];
    // From the largest bucket down, to the one that holds the k-th value.
    uint32_t b = l.mask;
    int64_t above = 0;
    while (above + counts[b] < k) above += counts[b--];
    k -= above;
    m = keep_bucket(c, m, l, b);
  }
  return c[0];
}

float top_p_cutoff(const float* w, int64_t n, float floor, double mass, float top_p,
                   SelectScratch& scratch) {
  auto& c = scratch.candidates;
  int64_t m = gather(w, n, floor, c);
  if (m == 0) return floor;
  double target = mass * (1.0 - static_cast<double>(top_p));
  // Rounding can leave no bucket whose running mass passes the target (the
  // target is then within rounding of the whole mass): keep the largest.
  bool largest = false;
  for (const Level& l : kLevels) {
    double masses[kMaxBuckets] = {};
    for (int64_t i = 0; i < m; ++i) masses[bucket(c[i], l)] += c[i];
    uint32_t b = 0;
    double below = 0.0;
    bool found = false;
    if (!largest) {
      for (; b <= l.mask; ++b) {
        if (below + masses[b] > target) {
          found = true;
          break;
        }
        below += masses[b];
      }
    }
    if (!found) {
      largest = true;
      for (b = l.mask; b > 0 && masses[b] == 0.0; --b) {}
    }
    target -= below;
    m = keep_bucket(c, m, l, b);
  }
  return c[0];
}

} // namespace vllm_metal::cpu
