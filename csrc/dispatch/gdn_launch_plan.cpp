#include "dispatch/gdn_launch_plan.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace vllm_metal::dispatch {

namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr int kKeysPerLane = 8;        // kGdnKeysPerLane in kernels_v2/gdn.h
constexpr int kRowsPerSimdgroup = 4;   // kGdnRowsPerSimdgroup
constexpr uint32_t kConvThreads = 128; // kGdnConvThreads
constexpr int kChunkMax = 64;          // kGdnChunkMax in kernels_v2/gdn_chunked.h
constexpr int kChunkTileRows = 32;     // kGdnChunkSimdgroups x kGdnChunkRowsPerSimdgroup
constexpr uint32_t kChunkThreads = 256;

[[noreturn]] void bad(const std::string& msg) {
  throw std::invalid_argument("gdn: " + msg);
}

uint32_t u32(int64_t v) {
  if (v < 1 || v > int64_t(UINT32_MAX)) bad("launch dimension out of range");
  return static_cast<uint32_t>(v);
}

kernels::GdnParams params_of(const GdnProblem& p) {
  if (p.dtype == KernelDtype::Unsupported) bad("no Metal kernels for this dtype");
  if (p.total_rows < 0 || p.num_seqs < 1 || p.num_blocks < 1 || p.lo_width < 0 || p.hi_width < 0) {
    bad("rows must be >= 0, num_seqs and num_blocks >= 1, widths >= 0");
  }
  kernels::GdnParams params;
  params.total_rows = p.total_rows;
  params.num_seqs = p.num_seqs;
  params.num_blocks = p.num_blocks;
  params.lo_width = p.lo_width;
  params.hi_width = p.hi_width;
  params.channels = p.channels;
  params.taps = p.taps;
  params.conv_offset = p.conv_offset;
  params.num_k_heads = p.num_k_heads;
  params.num_v_heads = p.num_v_heads;
  params.head_k_dim = p.head_k_dim;
  params.head_v_dim = p.head_v_dim;
  params.ssm_offset = p.ssm_offset;
  params.heads_in_lo = p.heads_in_lo;
  params.vector_gate = p.vector_gate ? 1 : 0;
  params.delta_rule = p.delta_rule ? 1 : 0;
  params.chunk = 0;
  return params;
}

KernelLaunch launch(const std::string& kernel, KernelDtype dtype, uint32_t x, uint32_t y, uint32_t z,
                    uint32_t threads) {
  return {kernel + "_" + dtype_name(dtype), {x, y, z}, {threads, 1, 1}, {false, false, false, false}, false};
}

}  // namespace

bool metal_supports_gdn(int head_k_dim) {
  return head_k_dim > 0 && head_k_dim % kSimdWidth == 0 && head_k_dim <= int(kSimdWidth) * kKeysPerLane;
}

bool metal_supports_gdn_chunk(int chunk) { return chunk >= 1 && chunk <= kChunkMax; }

GdnPlan plan_gdn_short_conv(const GdnProblem& p) {
  GdnPlan plan{{}, params_of(p)};
  if (p.channels < 1 || p.taps < 1) bad("channels and taps must be >= 1");
  if (p.conv_offset < 0 || p.conv_offset + int64_t(p.taps - 1) * p.channels > p.lo_width) {
    bad("the conv state does not fit lo at conv_offset");
  }
  const uint32_t blocks = u32((p.channels + kConvThreads - 1) / kConvThreads);
  if (p.total_rows > 0) {
    plan.launches.push_back(launch("gdn_short_conv", p.dtype, blocks, u32(p.total_rows), 1, kConvThreads));
  }
  plan.launches.push_back(launch("gdn_conv_state", p.dtype, blocks, u32(p.num_seqs), 1, kConvThreads));
  return plan;
}

GdnPlan plan_gdn_gated_delta(const GdnProblem& p) {
  GdnPlan plan{{}, params_of(p)};
  if (!metal_supports_gdn(p.head_k_dim)) bad("the Metal kernel takes Dk a multiple of 32 up to 256");
  if (p.head_v_dim < 1 || p.num_k_heads < 1 || p.num_v_heads % p.num_k_heads != 0) {
    bad("Dv and Hk must be >= 1 and Hv a multiple of Hk");
  }
  const int64_t per = int64_t(p.head_v_dim) * p.head_k_dim;
  if (p.heads_in_lo < 0 || p.heads_in_lo > p.num_v_heads || p.ssm_offset < 0 ||
      p.ssm_offset + p.heads_in_lo * per > p.lo_width || (p.num_v_heads - p.heads_in_lo) * per > p.hi_width) {
    bad("the head states do not fit lo and hi as placed");
  }
  if (p.chunk < 0) bad("chunk must be >= 0");
  const bool chunked = p.chunk > 0 && !p.vector_gate;
  if (chunked && !metal_supports_gdn_chunk(p.chunk)) {
    bad("the Metal chunked kernel takes chunks of 1 to 64 rows");
  }
  if (p.num_v_heads == 0) return plan;
  if (chunked) {
    plan.params.chunk = p.chunk;
    plan.launches.push_back(launch("gdn_gated_delta_chunked", p.dtype,
                                   u32((p.head_v_dim + kChunkTileRows - 1) / kChunkTileRows),
                                   u32(p.num_v_heads), u32(p.num_seqs), kChunkThreads));
    return plan;
  }
  plan.launches.push_back(launch("gdn_gated_delta", p.dtype,
                                 u32((p.head_v_dim + kRowsPerSimdgroup - 1) / kRowsPerSimdgroup),
                                 u32(p.num_v_heads), u32(p.num_seqs), kSimdWidth));
  return plan;
}

}  // namespace vllm_metal::dispatch
