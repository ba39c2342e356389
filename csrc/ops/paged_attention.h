// paged_attention: varlen causal attention that reads K/V through block tables.
#pragma once

#include <optional>
#include <vector>

#include "dispatch/paged_dispatch.h"
#include "kv_quant.h"

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * Attention for a packed batch of prefill, chunked-prefill and decode rows.
 *
 *   query         [total_q, num_heads, head_size]      float16/bfloat16/float32
 *   key_cache     [num_blocks, block_size, num_kv_heads, head_size]
 *   value_cache   same shape and dtype as key_cache
 *   block_tables  int32 [num_seqs, max_blocks_per_seq]
 *   seq_lens      int32 [num_seqs], context length including this step's rows
 *   cu_seqlens_q  int32 [num_seqs + 1], query row offsets of each sequence
 *   sinks         optional float32 [num_heads], one extra logit per head in the
 *                 softmax denominator
 *   kv_quant      a KvQuant: with one, the caches are uint8 [num_blocks,
 *                 block_size, num_kv_heads, head_size + 4] of codes and scales
 *                 (kv_quant.h), read on the CPU
 *   key_columns   float caches at head sizes 64 / 128 / 256, CPU only: key_cache
 *                 is [num_blocks, num_kv_heads, head_size, block_size] (each
 *                 page's keys as columns; value_cache keeps rows)
 *   key_ends      optional int32 [total_q]: row r also attends to the keys after
 *                 its position up to key_ends[r] - 1 (capped at its context):
 *                 the rows of a span that attends bidirectionally (the image
 *                 tokens of a prefix-LM such as Gemma 3) name the span's end
 *   returns       [total_q, num_heads, head_size] in query's dtype
 *
 * Query row j of sequence i sits at position seq_lens[i] - q_len_i + j and
 * attends causally to positions <= it (the last `sliding_window` positions if
 * set, counted back from it); `softcap` applies s = c * tanh(s / c) to the
 * scaled scores.
 */
mlx::core::array paged_attention(
    const mlx::core::array& query,
    const mlx::core::array& key_cache,
    const mlx::core::array& value_cache,
    const mlx::core::array& block_tables,
    const mlx::core::array& seq_lens,
    const mlx::core::array& cu_seqlens_q,
    float scale,
    std::optional<int> sliding_window = std::nullopt,
    std::optional<float> softcap = std::nullopt,
    const std::optional<mlx::core::array>& sinks = std::nullopt,
    int kv_quant = 0,
    bool key_columns = false,
    const std::optional<mlx::core::array>& key_ends = std::nullopt,
    mlx::core::StreamOrDevice s = {});

// Sequence and query lengths read on the host when the op is built (GPU
// stream only, and only if the metadata arrays are already evaluated): the
// dispatch decision of eval_gpu needs them before the GPU runs.
struct HostLengths {
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> query_lens;
};

class PagedAttention : public mlx::core::Primitive {
 public:
  PagedAttention(
      mlx::core::Stream stream,
      float scale,
      int sliding_window,
      float softcap,
      bool has_sinks,
      KvQuant kv_quant,
      bool key_columns,
      bool has_key_ends = false,
      std::optional<HostLengths> host_lengths = std::nullopt)
      : mlx::core::Primitive(stream),
        kv_quant_(kv_quant),
        key_columns_(key_columns),
        scale_(scale),
        sliding_window_(sliding_window),
        softcap_(softcap),
        has_sinks_(has_sinks),
        has_key_ends_(has_key_ends),
        host_lengths_(std::move(host_lengths)) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "PagedAttention";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  KvQuant kv_quant_;
  bool key_columns_;
  float scale_;
  int sliding_window_; // 0 = off
  float softcap_; // 0 = off
  bool has_sinks_;
  bool has_key_ends_; // the last input
  std::optional<HostLengths> host_lengths_;
};

} // namespace vllm_metal
