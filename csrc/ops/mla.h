// The multi-head latent attention ops (cpu/mla/mla_cpu.h has the maths):
// latent_cache_write stores each token's [latent, k_pe] row in its paged slot,
// mla_attention attends every query head over those rows, weight-absorbed.
#pragma once

#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 *   latent       [T, rank] float: the normalised compressed KV of each token
 *   k_pe         [T, rope_dim] float: its rotated positional key
 *   cache        [num_blocks, block_size, rank + rope_dim] float32/float16/bfloat16
 *   slot_mapping integer [T]: block_id * block_size + offset; negative: skipped
 *   returns      the cache after the write (its own buffer, written in place when
 *                evaluated; use the result so the graph orders the write first).
 * A slot past the cache raises at evaluation, before anything is written.
 */
mlx::core::array latent_cache_write(
    const mlx::core::array& latent,
    const mlx::core::array& k_pe,
    const mlx::core::array& cache,
    const mlx::core::array& slot_mapping,
    mlx::core::StreamOrDevice s = {});

/**
 *   q_latent      [T, H, rank]: each head's no-position query times W_UK (absorbed)
 *   q_pe          [T, H, rope_dim]: its rotated positional query; q's dtype
 *   cache         [num_blocks, block_size, rank + rope_dim] (latent_cache_write's)
 *   block_tables  int32 [S, max_blocks]; seq_lens int32 [S]; cu_seqlens_q int32 [S + 1]
 *   scale         the softmax scale
 *   returns       [T, H, rank] in q's dtype: softmax(scale * (q_latent . c + q_pe . k_pe)) @ c
 *                 over each sequence's tokens up to the row's position (causal)
 * Metadata that can only be checked on data (block ids, a sequence shorter than
 * its query rows) raises at evaluation.
 */
mlx::core::array mla_attention(
    const mlx::core::array& q_latent,
    const mlx::core::array& q_pe,
    const mlx::core::array& cache,
    const mlx::core::array& block_tables,
    const mlx::core::array& seq_lens,
    const mlx::core::array& cu_seqlens_q,
    float scale,
    mlx::core::StreamOrDevice s = {});

// Both run on the GPU stream (kernels_v2/mla.metal) when the kernels are loaded,
// the queries (latents), cache and output share a kernel dtype and the widths
// fit the kernels; otherwise on the CPU.
class LatentCacheWrite : public mlx::core::Primitive {
 public:
  explicit LatentCacheWrite(mlx::core::Stream stream) : mlx::core::Primitive(stream) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  const char* name() const override {
    return "VllmMetalLatentCacheWrite";
  }
  bool is_equivalent(const mlx::core::Primitive&) const override {
    return true;
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override {
    return {inputs[2].shape()};
  }
};

class MlaAttention : public mlx::core::Primitive {
 public:
  MlaAttention(mlx::core::Stream stream, float scale) : mlx::core::Primitive(stream), scale_(scale) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  const char* name() const override {
    return "VllmMetalMlaAttention";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return scale_ == static_cast<const MlaAttention&>(other).scale_;
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float scale_;
};

} // namespace vllm_metal
