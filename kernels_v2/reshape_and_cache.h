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
