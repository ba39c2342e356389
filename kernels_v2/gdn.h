// Gated DeltaNet over a packed batch whose per-request states live in KV pages
// (csrc/cpu/gdn/gdn_cpu.h has the maths; the CPU kernels compute the same).
// Request n owns rows [cu_seqlens[n], cu_seqlens[n + 1]) and block slots[n] of
// the float32 pages; has_state[n] == 0 starts it from zeros. A slot outside the
// pages gives NaN rows and writes nothing (a kernel cannot raise; the CPU op
// does). Each output is one fixed sequence of operations, whatever else is in
// the batch.
//
// The short conv is two launches, in order, over the same buffers:
// gdn_short_conv, grid (ceil(C / 128), T) of 128 threads: y[t, c] for one
// channel each, reading z (the old state rows, then x) directly; then, after a
// barrier (it overwrites state rows the first launch reads),
// gdn_conv_state, grid (ceil(C / 128), N): one thread per (request, channel)
// writes the request's last K - 1 inputs of its channel as the new state.
//
// gdn_gated_delta, grid (ceil(Dv / 4), Hv, N) threadgroups of one simdgroup:
// rows i0 .. i0 + 3 of value head h's [Dv, Dk] state for request n, held in
// registers over the request's tokens (rows of S never mix: each depends only
// on its own v entry). Lane l holds columns l, l + 32, ... of each row; per
// token and row, S k and S q are lane partial sums that meet in simd_sum.
// params.delta_rule 0 drops the S k term (S += beta outer(v, k): Mamba2's gated
// linear attention).
// A lane per whole row would need Dk registers (or Dv * Dk floats of threadgroup
// memory, 64 KB at 128 x 128): more than a GPU core gives.
//
// Buffers (conv): 0 x [T, C]; 1 weight float [C, K]; 2 lo [num_blocks, W], the
// state [K - 1, C] at conv_offset;
// 3 slots int [N]; 4 cu_seqlens int [N + 1]; 5 has_state int [N]; 6 y [T, C];
// 7 GdnParams.
// Buffers (gated delta): 0 q, 1 k [T, Hk, Dk]; 2 v [T, Hv, Dv]; 3 g float [T, Hv]
// or [T, Hv, Dk]; 4 beta float [T, Hv]; 5 lo; 6 hi; 7 slots; 8 cu_seqlens;
// 9 has_state; 10 y [T, Hv, Dv]; 11 GdnParams.
#pragma once

#include <metal_stdlib>

#include "gdn_params.h"

using namespace metal;

constant constexpr int kGdnConvThreads = 128;
constant constexpr int kGdnKeysPerLane = 8;       // Dk up to 256
constant constexpr int kGdnRowsPerSimdgroup = 4;

// The request of packed row t: the last n whose rows start at or before t (a
// request without rows this step starts where the next one does).
inline int gdn_request_of(device const int* cu_seqlens, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <typename T>
[[kernel]] void gdn_short_conv(
    device const T* x [[buffer(0)]],
    device const float* weight [[buffer(1)]],
    device const float* lo [[buffer(2)]],
    device const int* slots [[buffer(3)]],
    device const int* cu_seqlens [[buffer(4)]],
    device const int* has_state [[buffer(5)]],
    device T* y [[buffer(6)]],
    constant GdnParams& params [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]]) {
  const int c = int(group.x) * kGdnConvThreads + int(thread_id);
  const int t = int(group.y);
  if (c >= params.channels) return;
  const int n = gdn_request_of(cu_seqlens, params.num_seqs, t);
  const int i = t - cu_seqlens[n];
  const int keep = params.taps - 1;
  const long slot = slots[n];
  if (slot < 0 || slot >= params.num_blocks) {
    y[long(t) * params.channels + c] = T(NAN);
    return;
  }
  device const float* state = lo + slot * params.lo_width + params.conv_offset + c;
  const bool from_state = has_state[n] != 0;
  float acc = 0.0f;
  for (int j = 0; j < params.taps; ++j) {
    // z[i + j]: a state row while i + j < K - 1, else row t + j - (K - 1) of x.
    const int zi = i + j;
    float z;
    if (zi < keep) {
      z = from_state ? state[long(zi) * params.channels] : 0.0f;
    } else {
      z = float(x[long(t + j - keep) * params.channels + c]);
    }
    acc = fma(weight[long(c) * params.taps + j], z, acc);
  }
  y[long(t) * params.channels + c] = T(acc);
}

template <typename T>
[[kernel]] void gdn_conv_state(
    device const T* x [[buffer(0)]],
    device float* lo [[buffer(2)]],
    device const int* slots [[buffer(3)]],
    device const int* cu_seqlens [[buffer(4)]],
    device const int* has_state [[buffer(5)]],
    constant GdnParams& params [[buffer(7)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]]) {
  const int c = int(group.x) * kGdnConvThreads + int(thread_id);
  const int n = int(group.y);
  if (c >= params.channels) return;
  const long slot = slots[n];
  if (slot < 0 || slot >= params.num_blocks) return;
  const int start = cu_seqlens[n];
  const int rows = cu_seqlens[n + 1] - start;
  const int keep = params.taps - 1;
  device float* state = lo + slot * params.lo_width + params.conv_offset + c;
  const bool from_state = has_state[n] != 0;
  // New row r is z[rows + r]. Going up in r, row rows + r of the old state is
  // read before this thread writes it, so the shift is safe in place.
  for (int r = 0; r < keep; ++r) {
    const int zi = rows + r;
    float z;
    if (zi < keep) {
      z = from_state ? state[long(zi) * params.channels] : 0.0f;
    } else {
      z = float(x[long(start + zi - keep) * params.channels + c]);
    }
    state[long(r) * params.channels] = z;
  }
}

template <typename T>
[[kernel]] void gdn_gated_delta(
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
    uint lane [[thread_index_in_simdgroup]]) {
  const int i0 = int(group.x) * kGdnRowsPerSimdgroup;
  const int h = int(group.y);
  const int n = int(group.z);
  const int dk = params.head_k_dim, dv = params.head_v_dim, hv = params.num_v_heads;
  const int key_lanes = dk / 32;
  const int rows = min(kGdnRowsPerSimdgroup, dv - i0);
  const int kh = h / (hv / params.num_k_heads);
  const int start = cu_seqlens[n], end = cu_seqlens[n + 1];
  const long slot = slots[n];
  if (slot < 0 || slot >= params.num_blocks) {
    for (int t = start; t < end; ++t) {
      if (int(lane) < rows) y[(long(t) * hv + h) * dv + i0 + int(lane)] = T(NAN);
    }
    return;
  }
  const long per = long(dv) * dk;
  device float* state = h < params.heads_in_lo
      ? lo + slot * params.lo_width + params.ssm_offset + h * per
      : hi + slot * params.hi_width + (h - params.heads_in_lo) * per;
  state += long(i0) * dk;
  const bool from_state = has_state[n] != 0;
  float s[kGdnRowsPerSimdgroup][kGdnKeysPerLane];
  for (int r = 0; r < kGdnRowsPerSimdgroup; ++r) {
    for (int m = 0; m < kGdnKeysPerLane; ++m) {
      const bool held = r < rows && m < key_lanes && from_state;
      s[r][m] = held ? state[long(r) * dk + int(lane) + 32 * m] : 0.0f;
    }
  }
  for (int t = start; t < end; ++t) {
    const long key = (long(t) * params.num_k_heads + kh) * dk;
    const long head = long(t) * hv + h;
    float qv[kGdnKeysPerLane];
    float kv[kGdnKeysPerLane];
    float gv[kGdnKeysPerLane];
    const float scalar_gate = params.vector_gate ? 0.0f : g[head];
    for (int m = 0; m < kGdnKeysPerLane; ++m) {
      const int col = int(lane) + 32 * m;
      const bool in = m < key_lanes;
      qv[m] = in ? float(q[key + col]) : 0.0f;
      kv[m] = in ? float(k[key + col]) : 0.0f;
      gv[m] = !in ? 0.0f : params.vector_gate ? g[head * dk + col] : scalar_gate;
    }
    const float b = beta[head];
    for (int r = 0; r < kGdnRowsPerSimdgroup; ++r) {
      if (r >= rows) break;  // uniform over the simdgroup
      float part = 0.0f;
      for (int m = 0; m < kGdnKeysPerLane; ++m) {
        if (m < key_lanes) {
          s[r][m] *= gv[m];
          part = fma(s[r][m], kv[m], part);
        }
      }
      // Uniform over the grid, so every lane takes (or skips) the simd_sum.
      const float sk = params.delta_rule ? simd_sum(part) : 0.0f;
      const float delta = (float(v[head * dv + i0 + r]) - sk) * b;
      float out = 0.0f;
      for (int m = 0; m < kGdnKeysPerLane; ++m) {
        if (m < key_lanes) {
          s[r][m] = fma(delta, kv[m], s[r][m]);
          out = fma(s[r][m], qv[m], out);
        }
      }
      out = simd_sum(out);
      if (int(lane) == r) y[head * dv + i0 + r] = T(out);
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int m = 0; m < key_lanes; ++m) state[long(r) * dk + int(lane) + 32 * m] = s[r][m];
  }
}
