#include "dispatch/mla_launch_plan.h"

#include <cstdint>
#include <stdexcept>

namespace vllm_metal::dispatch {

namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr int kRankPerLane = 16;  // kMlaRankPerLane in kernels_v2/mla.h
constexpr int kRopePerLane = 4;   // kMlaRopePerLane
constexpr uint32_t kWriteThreads = 128;

uint32_t u32(int64_t v) {
  if (v < 1 || v > int64_t(UINT32_MAX)) throw std::invalid_argument("mla: launch dimension out of range");
  return static_cast<uint32_t>(v);
}

kernels::MlaParams params_of(const MlaProblem& p) {
  if (p.dtype == KernelDtype::Unsupported) throw std::invalid_argument("mla: no Metal kernels for this dtype");
  if (!metal_supports_mla(p.rank, p.rope_dim)) {
    throw std::invalid_argument("mla: the Metal kernels take rank a multiple of 32 up to 512 and rope_dim up to 128");
  }
  if (p.total_q < 1 || p.block_size < 1 || p.num_blocks < 1) {
    throw std::invalid_argument("mla: rows, block_size and num_blocks must be >= 1");
  }
  kernels::MlaParams params;
  params.total_q = p.total_q;
  params.num_seqs = p.num_seqs;
  params.num_heads = p.num_heads;
  params.rank = p.rank;
  params.rope_dim = p.rope_dim;
  params.block_size = p.block_size;
  params.num_blocks = p.num_blocks;
  params.max_blocks_per_seq = p.max_blocks_per_seq;
  params.scale = p.scale;
  return params;
}

}  // namespace

bool metal_supports_mla(int rank, int rope_dim) {
  return rank > 0 && rank % kSimdWidth == 0 && rank <= int(kSimdWidth) * kRankPerLane && rope_dim >= 0 &&
      rope_dim <= int(kSimdWidth) * kRopePerLane;
}

MlaPlan plan_latent_cache_write(const MlaProblem& p) {
  MlaPlan plan{{}, params_of(p)};
  plan.launch = {std::string("latent_cache_write_") + dtype_name(p.dtype),
                 {u32((p.rank + p.rope_dim + kWriteThreads - 1) / kWriteThreads), u32(p.total_q), 1},
                 {kWriteThreads, 1, 1},
                 {false, false, false, false},
                 false};
  return plan;
}

MlaPlan plan_mla_attention(const MlaProblem& p) {
  if (p.num_seqs < 1 || p.num_heads < 1 || p.max_blocks_per_seq < 1) {
    throw std::invalid_argument("mla: num_seqs, num_heads and max_blocks_per_seq must be >= 1");
  }
  MlaPlan plan{{}, params_of(p)};
  plan.launch = {std::string("mla_attention_") + dtype_name(p.dtype),
                 {u32(p.num_heads), u32(p.total_q), 1},
                 {kSimdWidth, 1, 1},
                 {false, false, false, false},
                 false};
  return plan;
}

}  // namespace vllm_metal::dispatch
