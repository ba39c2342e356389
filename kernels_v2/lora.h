// LoRA update of a packed step: out = (y +) scale[a] * (A[a] @ x[t]) @ B[a],
// a = idx[t], per row t, in two launches through an fp32 buffer u [T, r].
//
// lora_shrink, grid (ceil(r / kLoraShrinkSimdgroups), T) threadgroups of
// kLoraShrinkSimdgroups simdgroups: simdgroup s of threadgroup (g, t) forms
// u[t, j] = scale[a] * (A[a, j, :] . x[t, :]) for j = g * kLoraShrinkSimdgroups + s;
// lane l sums elements l, l + 32, ... in fp32 and simd_sum adds the lanes.
//
// lora_expand, grid (ceil(launch_columns / threads), T): one thread per out
// column c of row t. Inside the segment (c - column_offset in [0, out_features))
// of a row with an adapter it writes (y[t, c] +) u[t, :] . B[a, :, c - column_offset],
// summed over j in order; elsewhere y[t, c] (ADD) or 0.
//
// Rows are not grouped by adapter: the threadgroups of one adapter read the
// same A and B lines, which the GPU's caches serve after the first read. Each
// output is computed by one fixed sequence of operations, whatever the other
// rows are, so a row's result does not depend on the batch. An idx outside
// [0, num_slots) (-1: no adapter) gets no update: a kernel cannot raise; the
// host checks idx when it is known as the op is built.
//
// Buffers: 0 x [T, in]; 1 idx int [T]; 2 A [L, r, in]; 3 scale float [L];
// 4 u float [T, r] (shrink writes, expand reads); 5 LoraParams;
// 6 B [L, r, out_features] (a simdgroup's threads read adjacent columns); 7 y [T, out_cols] (read when ADD); 8 out [T, out_cols].
#pragma once

#include <metal_stdlib>

#include "lora_params.h"

using namespace metal;

constant constexpr int kLoraShrinkSimdgroups = 4;

template <typename T>
[[kernel]] void lora_shrink(
    device const T* x [[buffer(0)]],
    device const int* idx [[buffer(1)]],
    device const T* lora_a [[buffer(2)]],
    device const float* scale [[buffer(3)]],
    device float* u [[buffer(4)]],
    constant LoraParams& params [[buffer(5)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint simd_id [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]) {
  const int row = int(group.y);
  const int j = int(group.x) * kLoraShrinkSimdgroups + int(simd_id);
  if (j >= params.rank) return;  // the whole simdgroup: no collective is left waiting
  const int slot = idx[row];
  float acc = 0.0f;
  if (slot >= 0 && slot < params.num_slots) {  // uniform over the simdgroup
    device const T* xr = x + long(row) * params.in_features;
    device const T* ar = lora_a + (long(slot) * params.rank + j) * params.in_features;
    for (int c = int(lane); c < params.in_features; c += 32) acc = fma(float(xr[c]), float(ar[c]), acc);
    acc = simd_sum(acc) * scale[slot];
  }
  if (lane == 0) u[long(row) * params.rank + j] = acc;
}

template <typename T, bool ADD>
[[kernel]] void lora_expand(
    device const int* idx [[buffer(1)]],
    device const float* u [[buffer(4)]],
    constant LoraParams& params [[buffer(5)]],
    device const T* lora_b [[buffer(6)]],
    device const T* y [[buffer(7)]],
    device T* out [[buffer(8)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]]) {
  const int step = int(group.x * threads.x + thread_id);
  if (step >= params.launch_columns) return;
  const int column = params.first_column + step;
  const int row = int(group.y);
  const long at = long(row) * params.out_cols + column;
  const int seg = column - params.column_offset;
  const int slot = idx[row];
  if (seg >= 0 && seg < params.out_features && slot >= 0 && slot < params.num_slots) {
    device const float* ur = u + long(row) * params.rank;
    device const T* bc = lora_b + long(slot) * params.rank * params.out_features + seg;
    float acc = 0.0f;
    for (int j = 0; j < params.rank; ++j) acc = fma(ur[j], float(bc[long(j) * params.out_features]), acc);
    out[at] = T(ADD ? float(y[at]) + acc : acc);
  } else if (ADD) {
    out[at] = y[at];  // the base output's own bits: no update is no rounding
  } else {
    out[at] = T(0.0f);
  }
}
