#include "dispatch/experts_launch_plan.h"

#include <cstdint>
#include <stdexcept>

namespace vllm_metal::dispatch {

namespace {

constexpr uint32_t kSimdWidth = 32;
// kExpertRows and kExpertColumns in kernels_v2/experts.h.
constexpr int kRows = 8;
constexpr int kColumns = 4;

uint32_t u32(int64_t v) {
  if (v < 1 || v > int64_t(UINT32_MAX)) {
    throw std::invalid_argument("expert_matmul: launch dimension out of range");
  }
  return static_cast<uint32_t>(v);
}

}  // namespace

std::string experts_kernel_name(KernelDtype dtype, int bits, bool mxfp4) {
  const char* kind = mxfp4 ? "mxfp4" : bits == 0 ? "float" : bits == 4 ? "q4" : "q8";
  return std::string("experts_matmul_") + kind + "_" + dtype_name(dtype);
}

ExpertPlan plan_experts(const ExpertProblem& p) {
  if (p.dtype == KernelDtype::Unsupported) {
    throw std::invalid_argument("expert_matmul: no Metal kernels for this dtype");
  }
  if (p.bits != 0 && p.bits != 4 && p.bits != 8) {
    throw std::invalid_argument("expert_matmul: bits must be 0, 4 or 8");
  }
  if (p.rows < 1 || p.pairs < 1 || p.pairs % p.rows != 0 || p.in_features < 0 ||
      p.out_features < 1 || p.experts < 1) {
    throw std::invalid_argument(
        "expert_matmul: rows, pairs, out_features and experts must be >= 1, rows dividing pairs");
  }
  if (p.mxfp4 && (p.bits != 4 || p.group_size != 32)) {
    throw std::invalid_argument("expert_matmul: mxfp4 has bits 4 and group_size 32");
  }
  if (p.bits != 0 && (p.group_size < 8 || p.group_size % 8 != 0 || p.in_features % p.group_size != 0)) {
    throw std::invalid_argument("expert_matmul: quantized K must be whole groups of a multiple of 8");
  }
  ExpertPlan plan;
  plan.params.rows = p.rows;
  plan.params.pairs = p.pairs;
  plan.params.pairs_per_row = p.pairs / p.rows;
  plan.params.in_features = p.in_features;
  plan.params.out_features = p.out_features;
  plan.params.experts = p.experts;
  plan.params.group_size = p.bits != 0 ? p.group_size : 0;
  plan.params.has_bias = p.has_bias ? 1 : 0;
  plan.launch = {experts_kernel_name(p.dtype, p.bits, p.mxfp4),
                 {u32((p.out_features + kColumns - 1) / kColumns), u32((p.pairs + kRows - 1) / kRows), 1},
                 {kColumns * kSimdWidth, 1, 1},
                 {false, false, false, false},
                 false};
  return plan;
}

}  // namespace vllm_metal::dispatch
