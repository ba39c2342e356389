// embedding_gather: rows of a dense or MLX-quantized embedding table.
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "ops/cpu_only_primitive.h"

namespace vllm_metal {

/**
 * Token embeddings (nn.Embedding, nn.QuantizedEmbedding).
 *
 *   ids      integer [...] (cast to int32)
 *   table    dense: float [V, D]; quantized: uint32 [V, D * bits / 32]
 *   scales, biases  quantized only: float [V, D / group_size]
 *   returns  [..., D]: in table's dtype (dense) or scales' dtype (quantized,
 *            only the gathered rows are dequantized)
 *
 * An id outside [0, V) raises when the result is evaluated. tiled (quantized
 * only): table, scales and biases in the int8 kernels' tile order
 * (quantized_matmul.h), as a tied head's weights are then stored.
 */
mlx::core::array embedding_gather(
    const mlx::core::array& ids,
    const mlx::core::array& table,
    const std::optional<mlx::core::array>& scales = std::nullopt,
    const std::optional<mlx::core::array>& biases = std::nullopt,
    int bits = 0,
    int group_size = 0,
    bool tiled = false,
    mlx::core::StreamOrDevice s = {});

class EmbeddingGather : public CpuOnlyPrimitive {
 public:
  EmbeddingGather(mlx::core::Stream stream, int bits, int group_size, bool tiled)
      : CpuOnlyPrimitive(stream, "use the table's own indexing (run this op on the CPU stream: stream=mx.cpu)"),
        bits_(bits),
        group_size_(group_size),
        tiled_(tiled) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalEmbeddingGather";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int bits_; // 0 = dense table
  int group_size_;
  bool tiled_;
};

} // namespace vllm_metal
