#include "ops/kv_cache_shape.h"

#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

std::string shape_text(const mx::array& a) {
  std::string s = "(";
  for (int i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + ")";
}

} // namespace

std::string kv_cache_problem(const mx::array& key_cache, const mx::array& value_cache, KvQuant quant,
                             int num_kv_heads, int head_size, bool key_columns) {
  if (key_cache.ndim() != 4 || value_cache.ndim() != 4) {
    return "key_cache and value_cache must be [num_blocks, block_size, num_kv_heads, row width]";
  }
  if (value_cache.dtype() != key_cache.dtype()) return "key_cache and value_cache must have one dtype";
  if (quant == KvQuant::None ? !is_linear_float(key_cache.dtype()) : key_cache.dtype() != mx::uint8) {
    return "caches must be float16, bfloat16 or float32 (uint8 with kv_quant)";
  }
  if (!kv_head_size_ok(head_size, quant)) {
    return "a cache of 4-bit rows takes head sizes 64, 128 and 256, got " + std::to_string(head_size);
  }
  if (key_columns) {
    if (quant != KvQuant::None) return "key columns hold float caches only, not kv_quant " +
        std::to_string(static_cast<int>(quant));
    if (!pieces_head_size(head_size)) {
      return "key columns take head sizes 64, 128 and 256, got " + std::to_string(head_size);
    }
    if (value_cache.shape(2) != num_kv_heads || value_cache.shape(3) != head_size ||
        key_cache.shape(0) != value_cache.shape(0) || key_cache.shape(1) != num_kv_heads ||
        key_cache.shape(2) != head_size || key_cache.shape(3) != value_cache.shape(1)) {
      return "expected key_cache [num_blocks, " + std::to_string(num_kv_heads) + ", " + std::to_string(head_size) +
          ", block_size] (key columns) and value_cache [num_blocks, block_size, " + std::to_string(num_kv_heads) +
          ", " + std::to_string(head_size) + "], got " + shape_text(key_cache) + " and " + shape_text(value_cache);
    }
    return "";
  }
  const int kw = kv_key_width(head_size, quant);
  const int vw = kv_value_width(head_size, quant);
  if (key_cache.shape(0) != value_cache.shape(0) || key_cache.shape(1) != value_cache.shape(1) ||
      key_cache.shape(2) != num_kv_heads || value_cache.shape(2) != num_kv_heads || key_cache.shape(3) != kw ||
      value_cache.shape(3) != vw) {
    return "expected key_cache [num_blocks, block_size, " + std::to_string(num_kv_heads) + ", " +
        std::to_string(kw) + "] and value_cache [..., " + std::to_string(num_kv_heads) + ", " +
        std::to_string(vw) + "] for head size " + std::to_string(head_size) + " in this format, got " +
        shape_text(key_cache) + " and " + shape_text(value_cache);
  }
  return "";
}

} // namespace vllm_metal
