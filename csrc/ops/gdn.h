// The Gated DeltaNet (linear attention) ops (cpu/gdn/gdn_cpu.h has the maths):
// gdn_short_conv runs the causal depthwise conv in front of the recurrence,
// gdn_gated_delta the gated delta rule (or, without the delta rule, the gated
// linear attention of Mamba2's SSD mixers); both continue each request from the
// state in its block of the KV pages and write the new state there, in place.
#pragma once

#include <tuple>
#include <utility>
#include <vector>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace vllm_metal {

/**
 * The packed batch, shared by both ops:
 *   slots        integer [N]: each request's block id (distinct)
 *   cu_seqlens   integer [N + 1]: request n owns rows [cu_seqlens[n], cu_seqlens[n + 1])
 *   has_state    bool or integer [N]: 0 starts the request from zeros
 * Pages are float32 [num_blocks, W]: one of the K (lo) or V (hi) arrays of the
 * block's KV tensor seen as floats. The returned pages share the input pages'
 * buffers and are written in place when evaluated (use them afterwards, so the
 * graph orders the write first); only the requests' blocks are written. Slots
 * outside [0, num_blocks), named twice, or cu_seqlens not from 0 up to T raise
 * at evaluation, before anything is written.
 *
 *   x            [T, C] float16/bfloat16/float32
 *   weight       [C, K] float: the depthwise taps
 *   lo           [num_blocks, W] float32: the state, [K - 1, C] at lo[slot, conv_offset:]
 *   conv_offset  >= 0, conv_offset + (K - 1) * C <= W (a mixer with several convs
 *                keeps their states one after the other)
 *   returns      (y [T, C] in x's dtype, lo)
 */
std::pair<mlx::core::array, mlx::core::array> gdn_short_conv(
    const mlx::core::array& x,
    const mlx::core::array& weight,
    const mlx::core::array& lo,
    const mlx::core::array& slots,
    const mlx::core::array& cu_seqlens,
    const mlx::core::array& has_state,
    int conv_offset = 0,
    mlx::core::StreamOrDevice s = {});

/**
 *   q, k         [T, Hk, Dk] float16/bfloat16/float32
 *   v            [T, Hv, Dv], Hv a multiple of Hk; value head h reads key head h / (Hv / Hk)
 *   g            [T, Hv] or [T, Hv, Dk]: the decay, per head or per key column
 *   beta         [T, Hv]
 *   lo, hi       [num_blocks, W_lo], [num_blocks, W_hi] float32: head h's [Dv, Dk]
 *                state at lo[slot, ssm_offset + h * Dv * Dk] for h < heads_in_lo,
 *                else at hi[slot, (h - heads_in_lo) * Dv * Dk]
 *   delta_rule   true: S = g S; S += outer(beta (v - S k), k) (Gated DeltaNet);
 *                false: S = g S; S += beta outer(v, k) (Mamba2's gated linear attention);
 *                y = S q either way
 *   chunk        0: token by token; 32 or 64: with scalar gates, the chunked (WY)
 *                form in chunks of that many rows from each request's first row
 *                (cpu/gdn/gdn_chunked.h), a last chunk under 8 rows (a decode row,
 *                a prompt's tail) token by token: faster over prompts, equal up to
 *                rounding, and its rounding depends on where the chunks start
 *   returns      (y [T, Hv, Dv] in q's dtype, lo, hi)
 */
std::tuple<mlx::core::array, mlx::core::array, mlx::core::array> gdn_gated_delta(
    const mlx::core::array& q,
    const mlx::core::array& k,
    const mlx::core::array& v,
    const mlx::core::array& g,
    const mlx::core::array& beta,
    const mlx::core::array& lo,
    const mlx::core::array& hi,
    const mlx::core::array& slots,
    const mlx::core::array& cu_seqlens,
    const mlx::core::array& has_state,
    int ssm_offset,
    int heads_in_lo,
    bool delta_rule = true,
    int chunk = 0,
    mlx::core::StreamOrDevice s = {});

// Both run on the GPU stream (kernels_v2/gdn.metal) when the kernels are loaded,
// the pages are row-contiguous and, for gdn_gated_delta, q, k and v share a dtype
// and Dk fits the kernel (dispatch/gdn_launch_plan.h); otherwise on the CPU.
// Inputs: x, weight, lo, slots, cu_seqlens, has_state (int32). Outputs: y, lo.
class GdnShortConv : public mlx::core::Primitive {
 public:
  GdnShortConv(mlx::core::Stream stream, int conv_offset)
      : mlx::core::Primitive(stream), conv_offset_(conv_offset) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  const char* name() const override {
    return "VllmMetalGdnShortConv";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    return conv_offset_ == static_cast<const GdnShortConv&>(other).conv_offset_;
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override {
    return {inputs[0].shape(), inputs[2].shape()};
  }

 private:
  int conv_offset_;
};

// Inputs: q, k, v, g, beta, lo, hi, slots, cu_seqlens, has_state (int32).
// Outputs: y, lo, hi.
class GdnGatedDelta : public mlx::core::Primitive {
 public:
  GdnGatedDelta(mlx::core::Stream stream, int ssm_offset, int heads_in_lo, bool delta_rule,
                int chunk)
      : mlx::core::Primitive(stream),
        ssm_offset_(ssm_offset),
        heads_in_lo_(heads_in_lo),
        delta_rule_(delta_rule),
        chunk_(chunk) {}

  void eval_cpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  void eval_gpu(
      const std::vector<mlx::core::array>& inputs,
      std::vector<mlx::core::array>& outputs) override;
  const char* name() const override {
    return "VllmMetalGdnGatedDelta";
  }
  bool is_equivalent(const mlx::core::Primitive& other) const override {
    const auto& o = static_cast<const GdnGatedDelta&>(other);
    return ssm_offset_ == o.ssm_offset_ && heads_in_lo_ == o.heads_in_lo_ &&
        delta_rule_ == o.delta_rule_ && chunk_ == o.chunk_;
  }
  std::vector<mlx::core::Shape> output_shapes(
      const std::vector<mlx::core::array>& inputs) override {
    return {inputs[2].shape(), inputs[5].shape(), inputs[6].shape()};
  }

 private:
  int ssm_offset_;
  int heads_in_lo_;
  bool delta_rule_;
  int chunk_;
};

} // namespace vllm_metal
