// reshape_and_cache: write this step's K/V rows into their paged-cache slots.
#pragma once

#include <utility>
#include <vector>

#include "kv_quant.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * Scatter new K/V rows into the paged caches, in place.
 *
 *   key, value      [num_tokens, num_kv_heads, head_size]
 *   key_cache       [num_blocks, block_size, num_kv_heads, head_size]
 *   value_cache     same shape and dtype as key_cache
 *   slot_mapping    integer [num_tokens]; slot = block_id * block_size + offset;
 *                   negative slots (padding) are skipped
 *   kv_quant        a KvQuant: with one, the caches are uint8 [num_blocks,
 *                   block_size, num_kv_heads, head_size + 4] and each row is
 *                   written as codes and its scale (kv_quant.h), on the CPU
 *   key_columns     float caches, CPU only: key_cache is [num_blocks,
 *                   num_kv_heads, head_size, block_size] (paged_attention.h)
 *   returns         (key_cache, value_cache) after the write
 *
 * The returned arrays share the input caches' buffers (no copy: caches are
 * GBs); the write happens when they are evaluated. Use the returned arrays
 * afterwards so the graph orders the write before any read. key/value are
 * cast to the cache dtype. A slot >= num_blocks * block_size raises at eval
 * time, before anything is written.
 */
std::pair<mlx::core::array, mlx::core::array> reshape_and_cache(
    const mlx::core::array& key,
    const mlx::core::array& value,
    const mlx::core::array& key_cache,
    const mlx::core::array& value_cache,
    const mlx::core::array& slot_mapping,
    int kv_quant = 0,
    bool key_columns = false,
    mlx::core::StreamOrDevice s = {});

class ReshapeAndCache : public mlx::core::Primitive {
 public:
  ReshapeAndCache(mlx::core::Stream stream, KvQuant quant, bool key_columns)
      : mlx::core::Primitive(stream), quant_(quant), key_columns_(key_columns) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "ReshapeAndCache";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    const auto& o = static_cast<const ReshapeAndCache&>(other);
    return quant_ == o.quant_ && key_columns_ == o.key_columns_;
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  KvQuant quant_;
  bool key_columns_;
};

} // namespace vllm_metal
