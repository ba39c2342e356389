// Write this step's K/V rows into their cache slots.
//
// Grid: (num_tokens, 1, 1) threadgroups; the threads of token i copy its
// K and V rows (num_kv_heads * head_size elements each) to slot_mapping[i].
// A negative slot is padding and skipped; a slot past the cache is skipped too
// (a kernel cannot raise; the CPU op reports it).
//
// Buffers: 0 key, 1 value [num_tokens, num_kv_heads, head_size];
// 2 key_cache, 3 value_cache [num_blocks, block_size, num_kv_heads, head_size]
// (written in place); 4 slot_mapping int [num_tokens]; 5 ReshapeAndCacheParams.
#pragma once

#include <metal_stdlib>
#include <metal_simdgroup>

#include "kv_quant.h"
#include "paged_attention_params.h"

using namespace metal;

template <typename T>
[[kernel]] void reshape_and_cache(
    device const T* key [[buffer(0)]],
    device const T* value [[buffer(1)]],
    device T* key_cache [[buffer(2)]],
    device T* value_cache [[buffer(3)]],
    device const int* slot_mapping [[buffer(4)]],
    constant ReshapeAndCacheParams& params [[buffer(5)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint thread_id [[thread_index_in_threadgroup]],
    uint3 threads [[threads_per_threadgroup]]) {
  const int token = int(group.x);
  const int slot = slot_mapping[token];
  if (slot < 0 || slot >= params.num_slots) return;
  const long src = long(token) * params.row_elems;
  const long dst = long(slot) * params.row_elems;
  for (int i = int(thread_id); i < params.row_elems; i += int(threads.x)) {
    key_cache[dst + i] = key[src + i];
    value_cache[dst + i] = value[src + i];
  }
}

// One (token, KV head) row into a quantized cache row: its max |x| (one
// simdgroup), scale = max / largest code, the codes, then the scale.
template <typename T>
METAL_FUNC void write_quantized_row(device const T* x, device uchar* row, int head_size, uint lane) {
  float amax = 0.0f;
  for (int i = int(lane); i < head_size; i += 32) amax = max(amax, abs(float(x[i])));
  amax = simd_max(amax);
  const float scale = precise::divide(amax, kv_code_max());
  for (int i = int(lane); i < head_size; i += 32) {
    row[i] = kv_encode(scale > 0.0f ? precise::divide(float(x[i]), scale) : 0.0f);
  }
  if (lane == 0) *reinterpret_cast<device float*>(row + head_size) = scale;
}

// Writes this lane's Rot4 codes (element lane + 32 i is code[i]) into `row`:
// element 2k's code in the low nibble of byte k, 2k + 1's (the next lane's)
// in the high one.
METAL_FUNC void write_nibbles(thread const uint* code, int elems, device uchar* row, uint lane) {
  for (int i = 0; i < elems; ++i) {
    const uint high = simd_shuffle_down(code[i], ushort(1));
    if ((lane & 1u) == 0) row[(int(lane) + 32 * i) / 2] = uchar(code[i] | (high << 4));
  }
}

// One Rot4 key row (kv_quant.h, float32 arithmetic): rotated, each coordinate
// of its unit direction coded as the nearest level of N(0, 1/d), the factor
// float16(norm) / |levels picked|. d = 32 * elems.
template <int ELEMS, typename T>
METAL_FUNC void write_rot4_key(device const T* x, device uchar* row, uint lane) {
  float r[ELEMS];
  for (int i = 0; i < ELEMS; ++i) r[i] = float(x[int(lane) + 32 * i]);
  hadamard_simd<ELEMS>(r, lane);
  const float inv_sqrt_d = rsqrt(float(32 * ELEMS));
  float sq = 0.0f;
  for (int i = 0; i < ELEMS; ++i) {
    r[i] *= inv_sqrt_d;
    sq += r[i] * r[i];
  }
  const float norm = sqrt(simd_sum(sq));
  uint code[ELEMS];
  float picked = 0.0f;
  for (int i = 0; i < ELEMS; ++i) {
    // In units of the N(0, 1) levels: the direction times sqrt(d).
    const float u = norm > 0.0f ? precise::divide(r[i], norm) * sqrt(float(32 * ELEMS)) : 0.0f;
    uint c = 0;
    for (int k = 0; k < 15; ++k) c += (kRot4Levels[k] + kRot4Levels[k + 1]) * 0.5f < u ? 1u : 0u;
    code[i] = c;
    picked += kRot4Levels[c] * kRot4Levels[c];
  }
  picked = simd_sum(picked);
  write_nibbles(code, ELEMS, row, lane);
  if (lane == 0) {
    *reinterpret_cast<device float*>(row + 16 * ELEMS) = precise::divide(float(half(norm)), sqrt(picked));
  }
}

// One Rot4 value row: 16 even steps from the row's minimum, codes against the
// float16 step and minimum, ties to the even code.
template <int ELEMS, typename T>
METAL_FUNC void write_rot4_value(device const T* x, device uchar* row, uint lane) {
  float v[ELEMS];
  float lo = INFINITY;
  float hi = -INFINITY;
  for (int i = 0; i < ELEMS; ++i) {
    v[i] = float(x[int(lane) + 32 * i]);
    lo = min(lo, v[i]);
    hi = max(hi, v[i]);
  }
  const half minimum = half(simd_min(lo));
  const half step = half(precise::divide(simd_max(hi) - simd_min(lo), 15.0f));
  uint code[ELEMS];
  for (int i = 0; i < ELEMS; ++i) {
    const float c = float(step) > 0.0f ? rint(precise::divide(v[i] - float(minimum), float(step))) : 0.0f;
    code[i] = uint(clamp(c, 0.0f, 15.0f));
  }
  write_nibbles(code, ELEMS, row, lane);
  if (lane == 0) {
    *reinterpret_cast<device half*>(row + 16 * ELEMS) = step;
    *reinterpret_cast<device half*>(row + 16 * ELEMS + 2) = minimum;
  }
}

// A Rot4 (kv_quant 4) or K8V4 (5: e4m3 keys) pair of rows.
template <int ELEMS, typename T>
METAL_FUNC void write_4bit_rows(device const T* key, device const T* value, device uchar* k_row,
                                device uchar* v_row, uint lane) {
  if (kv_quant == 4) {
    write_rot4_key<ELEMS>(key, k_row, lane);
  } else {
    write_quantized_row(key, k_row, 32 * ELEMS, lane);
  }
  write_rot4_value<ELEMS>(value, v_row, lane);
}

// The write into a quantized cache (function constant kv_quant, kv_quant.h).
//
// Grid: (num_tokens, num_kv_heads, 1) threadgroups of one simdgroup, each
// writing one head row of K and of V. Slots as reshape_and_cache.
//
// Buffers: 0 key, 1 value [num_tokens, num_kv_heads, head_size] of T; 2
// key_cache, 3 value_cache bytes [num_blocks, block_size, num_kv_heads, row
// width] (kv_row_width / kv_value_row_width; written in place); 4 slot_mapping
// int [num_tokens]; 5 ReshapeAndCacheParams (head_size set).
template <typename T>
[[kernel]] void reshape_and_cache_quant(
    device const T* key [[buffer(0)]],
    device const T* value [[buffer(1)]],
    device uchar* key_cache [[buffer(2)]],
    device uchar* value_cache [[buffer(3)]],
    device const int* slot_mapping [[buffer(4)]],
    constant ReshapeAndCacheParams& params [[buffer(5)]],
    uint3 group [[threadgroup_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  const int token = int(group.x);
  const int head = int(group.y);
  const int slot = slot_mapping[token];
  if (slot < 0 || slot >= params.num_slots) return;
  const int d = params.head_size;
  const int heads = params.row_elems / d;
  const long src = (long(token) * heads + head) * d;
  const long dst = (long(slot) * heads + head) * kv_row_width(d);
  const long value_dst = (long(slot) * heads + head) * kv_value_row_width(d);
  if (kv_nibble_values()) {  // head sizes 64, 128, 256 (the op refuses others)
    if (d == 64) write_4bit_rows<2>(key + src, value + src, key_cache + dst, value_cache + value_dst, lane);
    if (d == 128) write_4bit_rows<4>(key + src, value + src, key_cache + dst, value_cache + value_dst, lane);
    if (d == 256) write_4bit_rows<8>(key + src, value + src, key_cache + dst, value_cache + value_dst, lane);
    return;
  }
  write_quantized_row(key + src, key_cache + dst, d, lane);
  write_quantized_row(value + src, value_cache + dst, d, lane);
}
