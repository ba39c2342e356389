// The shape check of a K/V cache pair, shared by the ops that take one
// (paged_attention, reshape_and_cache, decoder_stack).
#pragma once

#include <string>

#include "kv_quant.h"
#include "mlx/array.h"

namespace vllm_metal {

// "" when key_cache / value_cache are [num_blocks, block_size, num_kv_heads,
// width] caches of one dtype in format `quant` for this head size (widths
// kv_key_width / kv_value_width: K8V4's differ), else what is wrong. With
// key_columns, key_cache is [num_blocks, num_kv_heads, head_size, block_size]
// instead: float caches at head sizes 64 / 128 / 256 only (the CPU pieces
// kernel's; quantized rows keep their scales beside their codes).
std::string kv_cache_problem(const mlx::core::array& key_cache, const mlx::core::array& value_cache,
                             KvQuant quant, int num_kv_heads, int head_size, bool key_columns = false);

} // namespace vllm_metal
