// lora_matmul: the low-rank (LoRA) update of a packed step, each row with the
// adapter of its request, computed per row inside the step (no merged weights).
#pragma once

#include <optional>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * The LoRA update of each row: row t takes the adapter in slot a = idx[t].
 *
 *   x       [..., in] float16/bfloat16/float32; its leading dimensions are the T rows
 *   idx     integer [T] in [-1, L): -1 = no adapter (a zero update)
 *   lora_a  [L, r, in], x's dtype: every slot's A, ranks below r padded with zeros
 *   lora_b  [L, r, out], x's dtype (B transposed: a column block of a row is contiguous)
 *   scale   float [L] (alpha / rank of each slot), used as float32
 *   returns [..., out] in x's dtype: scale[a] * (A[a] @ x[t]) @ B[a],
 *           accumulated in float32 and rounded once
 *
 * An idx outside [-1, L) raises at evaluation on the CPU, before anything is
 * written; on the GPU it is checked when the op is built if idx is already
 * evaluated, else such a row gets no update.
 */
mlx::core::array lora_delta(
    const mlx::core::array& x,
    const mlx::core::array& idx,
    const mlx::core::array& lora_a,
    const mlx::core::array& lora_b,
    const mlx::core::array& scale,
    mlx::core::StreamOrDevice s = {});

/**
 * y with the LoRA update of each row added, in one pass and one rounding.
 *
 *   y       [..., out_cols], x's dtype and leading dimensions: the base layer's output
 *   column_offset  the y column of update column 0: columns [column_offset,
 *           column_offset + out) get the update (one slice of a fused projection)
 *   returns y's shape and dtype; rows with idx -1 and the other columns are y's
 *
 * y's buffer is reused for the result when nothing else holds y (MLX's
 * donation), so chaining one call per slice of a fused projection writes
 * only the slices.
 */
mlx::core::array lora_apply(
    const mlx::core::array& y,
    const mlx::core::array& x,
    const mlx::core::array& idx,
    const mlx::core::array& lora_a,
    const mlx::core::array& lora_b,
    const mlx::core::array& scale,
    int column_offset = 0,
    mlx::core::StreamOrDevice s = {});

// inputs: x, idx (int32), lora_a, lora_b, scale (float32)[, y]
class LoraMatmul : public mlx::core::Primitive {
 public:
  LoraMatmul(mlx::core::Stream stream, bool add, int column_offset)
      : mlx::core::Primitive(stream), add_(add), column_offset_(column_offset) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalLora";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  bool add_;           // out = y + update (inputs[5] is y)
  int column_offset_;  // with add_: y column of update column 0
};

// y's buffer may hold the result: nothing else holds y, and it is laid out as out.
bool lora_can_donate(const mlx::core::array& y, const mlx::core::array& out);

} // namespace vllm_metal
