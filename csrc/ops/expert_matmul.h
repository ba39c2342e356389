// expert_matmul: the expert products of a mixture-of-experts layer, each
// (token, expert) pair's row against its expert's matrix, grouped by expert.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * out[p] = x[p / (P / R)] @ W[idx[p]].T (+ bias[idx[p]]) for the P pairs.
 *
 *   x        [R, K] float32/bfloat16/float16; R divides P: each row feeds P / R
 *            consecutive pairs (a token's row shared by its top-k experts, or
 *            one row per pair)
 *   idx      int32 or uint32 [P], expert of each pair, in [0, E)
 *   w        float [E, N, K]; or uint32 [E, N, K * bits / 32], MLX affine
 *            quantization with scales and biases [E, N, K / group_size]; or
 *            (mode "mxfp4": bits 4, group_size 32) FP4 codes with uint8 E8M0
 *            scales [E, N, K / 32] and no biases
 *   bias     optional float [E, N]: each expert's bias
 *   returns  [P, N] accumulated in float32, in MLX's promotion of x's, the
 *            weights' (scales') and the bias' dtypes
 *
 * bits 0 for float w, else 4 or 8 with group_size 32, 64 or 128. Only the
 * experts idx names are read, each once per call. An idx outside [0, E)
 * raises at evaluation on the CPU, before anything is written; on the GPU
 * (kernels_v2/experts.metal: x, weights (scales) and bias of one dtype) such
 * a pair's row is NaN.
 *
 * int8_activations (affine weights, CPU only): x rounded to int8 per 32
 * columns (quantized_matmul.h); a pair's row is then the same bits whatever
 * else the call holds. tiled (with int8_activations): each expert's w, scales
 * and biases in the int8 kernels' tile order (quantized_matmul.h), tiled on
 * their own.
 */
mlx::core::array expert_matmul(
    const mlx::core::array& x,
    const mlx::core::array& idx,
    const mlx::core::array& w,
    const std::optional<mlx::core::array>& scales,
    const std::optional<mlx::core::array>& biases,
    int bits,
    int group_size,
    const std::optional<mlx::core::array>& bias = std::nullopt,
    const std::string& mode = "affine",
    bool int8_activations = false,
    bool tiled = false,
    mlx::core::StreamOrDevice s = {});

// inputs: x, idx, w[, scales[, biases]][, bias] (no biases for MXFP4); on the
// GPU also idx's argsort (the pairs grouped by expert), last.
class ExpertMatmul : public mlx::core::Primitive {
 public:
  ExpertMatmul(mlx::core::Stream stream, int bits, int group_size, bool mxfp4, bool has_bias,
               bool int8_activations, bool tiled)
      : mlx::core::Primitive(stream),
        bits_(bits),
        group_size_(group_size),
        mxfp4_(mxfp4),
        has_bias_(has_bias),
        int8_activations_(int8_activations),
        tiled_(tiled) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;

  const char* name() const override {
    return "VllmMetalExpertMatmul";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override;
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override;

 private:
  int bits_;  // 0: float weights
  int group_size_;
  bool mxfp4_;
  bool has_bias_;
  bool int8_activations_;
  bool tiled_;
};

} // namespace vllm_metal
