// The gated delta rule in chunks (the recurrence itself, token by token, is
// gdn_gated_delta in gdn.h, whose header gives the batch, the pages and the
// buffers; this kernel binds the same buffers and follows the same rules).
//
// Within a chunk of c rows from state S0, with scalar gates g_t, ratios
// r(t, i) = prod_{i < s <= t} g_s (r(t, t) = 1) and gamma_t = r(t, 0) g_0:
//   (I + A) D = diag(beta) (V - diag(gamma) K S0^T),  A[t, i] = beta_t r(t, i) k_t.k_i
//   (i < t; forward substitution); without the delta rule D = diag(beta) V;
//   y_t = gamma_t S0 q_t + sum_{i <= t} r(t, i) (k_i.q_t) D_i;
//   S_end = gamma_last S0 + sum_i r(last, i) D_i k_i^T.
// Unrolling S_t = g_t S_{t-1} + D_t k_t^T, D_t = beta_t (v_t - g_t S_{t-1} k_t),
// gives these. Ratios are products over (i, t], never gamma_t / gamma_i, so a
// gate of 0 or one that underflows gives zeros, not NaN.
//
// gdn_gated_delta_chunked, grid (ceil(Dv / 32), Hv, N) threadgroups of 8
// simdgroups: rows 32 x .. 32 x + 31 of value head h's state for request n,
// looping over the request's chunks of params.chunk rows from its first row.
// Simdgroup s holds rows 32 x + 4 s .. + 3 in registers as the recurrent kernel
// does (lane l: columns l, l + 32, ...; a float4 over the 4 rows). Per chunk:
// 1. every simdgroup takes chunk rows t = s, s + 8, ...: k_t.k_i and q_t.k_i
//    for i <= t (lanes over Dk, simd_sum) times the ratios, into threadgroup
//    memory as the lower triangles A and M = r (K Q^T)^T;
// 2. after a barrier each simdgroup with rows: S0 k_t and S0 q_t per chunk row
//    (simd_sum), the right-hand side; the solve and y, one chunk row at a time,
//    lane l keeping D's rows l and l + 32 (the sum over i < t is a simd_sum of
//    the lanes' terms); then the state update from D through threadgroup memory.
// Every tile recomputes the chunk's A and M (Dk work per pair): that keeps a
// tile's state in registers and as many simdgroups in the grid as the
// recurrent kernel has.
#pragma once

#include <metal_stdlib>

#include "gdn_params.h"

using namespace metal;

constant constexpr int kGdnChunkMax = 64;         // rows per chunk (threadgroup memory)
constant constexpr int kGdnChunkSimdgroups = 8;
constant constexpr int kGdnChunkRowsPerSimdgroup = 4;  // a float4 of state rows
constant constexpr int kGdnChunkKeysPerLane = 8;  // Dk up to 256
constant constexpr int kGdnChunkPairs = kGdnChunkMax * (kGdnChunkMax + 1) / 2;
static_assert(4 * (2 * kGdnChunkPairs + 2 * kGdnChunkMax + 4 * kGdnChunkSimdgroups * kGdnChunkMax) <= 32768,
              "the threadgroup arrays must fit a GPU core's 32 KB");

// A's strictly lower triangle and M's lower triangle, row after row.
inline int gdn_below(int t, int i) { return t * (t - 1) / 2 + i; }
inline int gdn_on_or_below(int t, int i) { return t * (t + 1) / 2 + i; }

template <typename T>
inline void gdn_chunk_load_keys(device const T* row, uint lane, int key_lanes, thread float* out) {
  for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
    out[m] = m < key_lanes ? float(row[int(lane) + 32 * m]) : 0.0f;
  }
}

template <typename T>
[[kernel]] void gdn_gated_delta_chunked(
    device const T* q [[buffer(0)]],
    device const T* k [[buffer(1)]],
    device const T* v [[buffer(2)]],
    device const float* g [[buffer(3)]],
    device const float* beta [[buffer(4)]],
    device float* lo [[buffer(5)]],
    device float* hi [[buffer(6)]],
    device const int* slots [[buffer(7)]],
    device const int* cu_seqlens [[buffer(8)]],
    device const int* has_state [[buffer(9)]],
    device T* y [[buffer(10)]],
    constant GdnParams& params [[buffer(11)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float tg_a[kGdnChunkPairs];   // A[t, i], i < t (the first row is empty)
  threadgroup float tg_m[kGdnChunkPairs];   // M[t, i] = r(t, i) k_i.q_t, i <= t
  threadgroup float tg_tail[kGdnChunkMax];  // r(last, i)
  threadgroup float tg_gamma[kGdnChunkMax];
  threadgroup float4 tg_d[kGdnChunkSimdgroups][kGdnChunkMax];  // D, per simdgroup's rows

  const int tile = int(group.x) * kGdnChunkSimdgroups * kGdnChunkRowsPerSimdgroup;
  const int i0 = tile + int(sg) * kGdnChunkRowsPerSimdgroup;
  const int h = int(group.y);
  const int n = int(group.z);
  const int dk = params.head_k_dim, dv = params.head_v_dim, hv = params.num_v_heads;
  const int key_lanes = dk / 32;
  const int rows = clamp(dv - i0, 0, kGdnChunkRowsPerSimdgroup);
  const int kh = h / (hv / params.num_k_heads);
  const int chunk = clamp(params.chunk, 1, kGdnChunkMax);
  const bool delta = params.delta_rule != 0;
  const int start = cu_seqlens[n], end = cu_seqlens[n + 1];
  const long slot = slots[n];
  if (slot < 0 || slot >= params.num_blocks) {
    // The whole threadgroup returns, before any barrier.
    const int row = tile + int(thread_id);
    if (int(thread_id) < kGdnChunkSimdgroups * kGdnChunkRowsPerSimdgroup && row < dv) {
      for (int t = start; t < end; ++t) y[(long(t) * hv + h) * dv + row] = T(NAN);
    }
    return;
  }
  const long per = long(dv) * dk;
  device float* state = h < params.heads_in_lo
      ? lo + slot * params.lo_width + params.ssm_offset + h * per
      : hi + slot * params.hi_width + (h - params.heads_in_lo) * per;
  state += long(i0) * dk;
  const bool from_state = has_state[n] != 0;
  float4 s[kGdnChunkKeysPerLane];  // s[m][r]: row i0 + r, column lane + 32 m
  for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
    for (int r = 0; r < kGdnChunkRowsPerSimdgroup; ++r) {
      const bool held = r < rows && m < key_lanes && from_state;
      s[m][r] = held ? state[long(r) * dk + int(lane) + 32 * m] : 0.0f;
    }
  }

  for (int t0 = start; t0 < end; t0 += chunk) {
    const int c = min(chunk, end - t0);
    // 1. The chunk's pairs, walking i down from t so r(t, i) is one product more each step.
    for (int t = int(sg); t < c; t += kGdnChunkSimdgroups) {
      const long head_t = long(t0 + t) * hv + h;
      float kt[kGdnChunkKeysPerLane], qt[kGdnChunkKeysPerLane];
      gdn_chunk_load_keys(k + (long(t0 + t) * params.num_k_heads + kh) * dk, lane, key_lanes, kt);
      gdn_chunk_load_keys(q + (long(t0 + t) * params.num_k_heads + kh) * dk, lane, key_lanes, qt);
      const float b = beta[head_t];
      float ratio = 1.0f;  // r(t, i)
      for (int i = t; i >= 0; --i) {
        device const T* ki = k + (long(t0 + i) * params.num_k_heads + kh) * dk;
        float2 part = float2(0.0f);
        for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
          if (m < key_lanes) {
            const float kim = float(ki[int(lane) + 32 * m]);
            part.x = fma(kt[m], kim, part.x);
            part.y = fma(qt[m], kim, part.y);
          }
        }
        const float2 dots = simd_sum(part);
        if (lane == 0) {
          tg_m[gdn_on_or_below(t, i)] = ratio * dots.y;
          if (i < t) tg_a[gdn_below(t, i)] = b * ratio * dots.x;
          if (t == c - 1) tg_tail[i] = ratio;
        }
        const float gi = g[long(t0 + i) * hv + h];
        ratio = i > 0 ? ratio * gi : ratio;
        if (i == 0 && lane == 0) tg_gamma[t] = ratio * gi;
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    if (rows > 0) {  // uniform over the simdgroup; no threadgroup barrier inside
      // 2a. Right-hand side and gamma_t S0 q_t; lane l keeps chunk rows l and l + 32.
      float4 rhs[2] = {float4(0.0f), float4(0.0f)}, inter[2] = {float4(0.0f), float4(0.0f)};
      for (int t = 0; t < c; ++t) {
        const long head_t = long(t0 + t) * hv + h;
        float kt[kGdnChunkKeysPerLane], qt[kGdnChunkKeysPerLane];
        gdn_chunk_load_keys(k + (long(t0 + t) * params.num_k_heads + kh) * dk, lane, key_lanes, kt);
        gdn_chunk_load_keys(q + (long(t0 + t) * params.num_k_heads + kh) * dk, lane, key_lanes, qt);
        float4 sk = float4(0.0f), sq = float4(0.0f);
        for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
          if (m < key_lanes) {
            sk = fma(s[m], float4(kt[m]), sk);
            sq = fma(s[m], float4(qt[m]), sq);
          }
        }
        const float gamma = tg_gamma[t];
        float4 vt = float4(0.0f);
        for (int r = 0; r < kGdnChunkRowsPerSimdgroup; ++r) {
          if (r < rows) vt[r] = float(v[head_t * dv + i0 + r]);
        }
        if (delta) vt -= gamma * simd_sum(sk);  // uniform branch
        const float4 out = gamma * simd_sum(sq);
        for (int half = 0; half < 2; ++half) {
          if (int(lane) + 32 * half == t) {
            rhs[half] = beta[head_t] * vt;
            inter[half] = out;
          }
        }
      }
      // 2b. D by forward substitution, and y, one chunk row at a time.
      float4 d[2] = {float4(0.0f), float4(0.0f)};
      for (int t = 0; t < c; ++t) {
        float4 pa = float4(0.0f), pm = float4(0.0f);
        for (int half = 0; half < 2; ++half) {
          const int i = int(lane) + 32 * half;
          if (i < t) {
            if (delta) pa = fma(float4(tg_a[gdn_below(t, i)]), d[half], pa);
            pm = fma(float4(tg_m[gdn_on_or_below(t, i)]), d[half], pm);
          }
        }
        const float4 sum_a = delta ? simd_sum(pa) : float4(0.0f);
        const float4 sum_m = simd_sum(pm);
        for (int half = 0; half < 2; ++half) {
          if (int(lane) + 32 * half == t) {
            d[half] = rhs[half] - sum_a;
            const float4 yt = fma(float4(tg_m[gdn_on_or_below(t, t)]), d[half], inter[half] + sum_m);
            device T* out = y + (long(t0 + t) * hv + h) * dv + i0;
            for (int r = 0; r < kGdnChunkRowsPerSimdgroup; ++r) {
              if (r < rows) out[r] = T(yt[r]);
            }
          }
        }
      }
      // 2c. S_end = gamma_last S0 + sum_i r(last, i) D_i k_i^T.
      for (int half = 0; half < 2; ++half) {
        const int i = int(lane) + 32 * half;
        if (i < c) tg_d[sg][i] = d[half];
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
      const float gamma_last = tg_gamma[c - 1];
      for (int m = 0; m < kGdnChunkKeysPerLane; ++m) s[m] *= gamma_last;
      for (int i = 0; i < c; ++i) {
        const float4 coef = tg_tail[i] * tg_d[sg][i];
        device const T* ki = k + (long(t0 + i) * params.num_k_heads + kh) * dk;
        for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
          if (m < key_lanes) s[m] = fma(coef, float4(float(ki[int(lane) + 32 * m])), s[m]);
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  // Constant trip counts (here and above) keep s, kt and qt in registers.
  for (int m = 0; m < kGdnChunkKeysPerLane; ++m) {
    for (int r = 0; r < kGdnChunkRowsPerSimdgroup; ++r) {
      if (m < key_lanes && r < rows) state[long(r) * dk + int(lane) + 32 * m] = s[m][r];
    }
  }
}
