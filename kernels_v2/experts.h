// Expert matmul of a mixture-of-experts layer, the pairs grouped by expert:
// out[p, n] = x[p / pairs_per_row, :] . W[idx[p], n, :] (+ bias[idx[p], n]).
//
// order [P] lists the pairs sorted by expert (the host sorts idx in the graph),
// so a threadgroup's kExpertRows consecutive positions mostly share one expert.
// Grid (ceil(N / kExpertColumns), ceil(P / kExpertRows)) threadgroups of
// kExpertColumns simdgroups: simdgroup s of threadgroup (g, t) computes column
// n = g * kExpertColumns + s for the pairs at positions [t * kExpertRows, ...).
// Lane l walks K in chunks of 8 columns (l * 8, l * 8 + 256, ...); per chunk it
// decodes W[e, n, chunk] once for a run of positions with the same expert e and
// adds its products to one fp32 accumulator per position; simd_sum adds the
// lanes. Each output is one fixed sequence of operations (its chunks in order,
// the lanes summed by simd_sum), whatever the other pairs are, so a pair's
// result does not depend on the batch. An idx outside [0, E) gets NaN: a kernel
// cannot raise (the CPU op raises; the GPU op's idx comes from a top-k).
//
// W (MODE): float [E, N, K] of T (kExpertFloat); MLX affine codes uint32
// [E, N, K * bits / 32] with scales and biases [E, N, K / group_size] of T, W =
// scale * q + bias (kExpertAffine4, kExpertAffine8); or MXFP4: FP4 (e2m1) codes
// uint32 [E, N, K / 8] with uchar E8M0 scales [E, N, K / 32], W = fp4(q) *
// 2^(e - 127), no biases (kExpertMxfp4).
// Buffers: 0 x [R, K]; 1 idx int [P]; 2 order int [P]; 3 W; 4 scales (unused
// for float W); 5 biases (affine only); 6 bias [E, N] (read when has_bias);
// 7 out [P, N]; 8 ExpertParams. K is a multiple of 8 for quantized W (group
// sizes are).
#pragma once

#include <metal_stdlib>

#include "experts_params.h"

using namespace metal;

constant constexpr int kExpertFloat = 0;
constant constexpr int kExpertAffine4 = 4;
constant constexpr int kExpertAffine8 = 8;
constant constexpr int kExpertMxfp4 = 1;

constant constexpr int kExpertRows = 8;
constant constexpr int kExpertColumns = 4;
constant constexpr int kExpertChunk = 8;  // columns of K per lane per step

// The value of an FP4 (e2m1) code: sign bit 3, exponent bits 1-2, mantissa bit 0.
inline float fp4_value(uint code) {
  const uint e = (code >> 1) & 3u;
  const float m = float(code & 1u);
  const float magnitude = e == 0 ? 0.5f * m : float(1u << (e - 1)) * (1.0f + 0.5f * m);
  return (code & 8u) != 0 ? -magnitude : magnitude;
}

// 2^(e - 127) (e = 0: 2^-127; e = 255: inf), as MLX decodes an E8M0 scale.
inline float e8m0_value(uchar e) {
  return e == 0 ? 0x1p-127f : as_type<float>(uint(e) << 23);
}

// w[0..8) = W[e, n, c .. c + 8) as float, c a multiple of 8 (one scale group).
template <typename T, typename WT, typename ST, int MODE>
inline void expert_chunk(device const WT* w, device const ST* scales, device const ST* biases,
                         constant ExpertParams& params, long row, int c, thread float (&out)[kExpertChunk]) {
  if (MODE == kExpertFloat) {
    device const T* wr = reinterpret_cast<device const T*>(w) + row * params.in_features;
    for (int j = 0; j < kExpertChunk; ++j) {
      out[j] = c + j < params.in_features ? float(wr[c + j]) : 0.0f;
    }
    return;
  }
  const int bits = MODE == kExpertAffine8 ? 8 : 4;
  device const uint* wr = reinterpret_cast<device const uint*>(w) + row * (long(params.in_features) * bits / 32);
  const long g = row * (params.in_features / params.group_size) + c / params.group_size;
  if (MODE == kExpertMxfp4) {
    const float s = e8m0_value(reinterpret_cast<device const uchar*>(scales)[g]);
    const uint word = wr[c / 8];
    for (int j = 0; j < kExpertChunk; ++j) out[j] = fp4_value((word >> (4 * j)) & 0xFu) * s;
    return;
  }
  const float s = float(scales[g]);
  const float b = float(biases[g]);
  if (MODE == kExpertAffine4) {
    const uint word = wr[c / 8];
    for (int j = 0; j < kExpertChunk; ++j) out[j] = fma(s, float((word >> (4 * j)) & 0xFu), b);
  } else {
    const uint lo = wr[c / 4];
    const uint hi = wr[c / 4 + 1];
    for (int j = 0; j < 4; ++j) {
      out[j] = fma(s, float((lo >> (8 * j)) & 0xFFu), b);
      out[j + 4] = fma(s, float((hi >> (8 * j)) & 0xFFu), b);
    }
  }
}

template <typename T, typename WT, typename ST, int MODE>
[[kernel]] void experts_matmul(
    device const T* x [[buffer(0)]],
    device const int* idx [[buffer(1)]],
    device const int* order [[buffer(2)]],
    device const WT* w [[buffer(3)]],
    device const ST* scales [[buffer(4)]],
    device const ST* biases [[buffer(5)]],
    device const T* bias [[buffer(6)]],
    device T* out [[buffer(7)]],
    constant ExpertParams& params [[buffer(8)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint simd_id [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  const int n = int(group.x) * kExpertColumns + int(simd_id);
  if (n >= params.out_features) return;  // the whole simdgroup: no collective is left waiting
  const int first = int(group.y) * kExpertRows;
  const int count = min(kExpertRows, params.pairs - first);
  int pair[kExpertRows];
  int expert[kExpertRows];
  float acc[kExpertRows];
  for (int r = 0; r < kExpertRows; ++r) {
    pair[r] = r < count ? order[first + r] : 0;
    expert[r] = r < count ? idx[pair[r]] : -1;
    acc[r] = 0.0f;
  }
  const int k = params.in_features;
  for (int c = int(lane) * kExpertChunk; c < k; c += 32 * kExpertChunk) {
    float wv[kExpertChunk];
    int decoded = -1;
    for (int r = 0; r < count; ++r) {
      const int e = expert[r];
      if (e < 0 || e >= params.experts) continue;
      if (e != decoded) {
        expert_chunk<T, WT, ST, MODE>(w, scales, biases, params, long(e) * params.out_features + n, c, wv);
        decoded = e;
      }
      device const T* xr = x + long(pair[r] / params.pairs_per_row) * k + c;
      for (int j = 0; j < kExpertChunk; ++j) {
        if (c + j < k) acc[r] = fma(float(xr[j]), wv[j], acc[r]);
      }
    }
  }
  for (int r = 0; r < count; ++r) {
    const float sum = simd_sum(acc[r]);
    if (lane != 0) continue;
    const int e = expert[r];
    float value = NAN;
    if (e >= 0 && e < params.experts) {
      value = sum;
      if (params.has_bias) value += float(bias[long(e) * params.out_features + n]);
    }
    out[long(pair[r]) * params.out_features + n] = T(value);
  }
}
