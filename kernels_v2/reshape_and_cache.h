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

// The write into a quantized cache (function constant kv_quant, kv_quant.h).
//
// Grid: (num_tokens, num_kv_heads, 1) threadgroups of one simdgroup, each
// writing one head row of K and of V. Slots as reshape_and_cache.
//
// Buffers: 0 key, 1 value [num_tokens, num_kv_heads, head_size] of T; 2
// key_cache, 3 value_cache bytes [num_blocks, block_size, num_kv_heads,
// head_size + 4] (written in place); 4 slot_mapping int [num_tokens]; 5
// ReshapeAndCacheParams (head_size set).
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
  const long dst = (long(slot) * heads + head) * (d + kKvScaleBytes);
  write_quantized_row(key + src, key_cache + dst, d, lane);
  write_quantized_row(value + src, value_cache + dst, d, lane);
}
