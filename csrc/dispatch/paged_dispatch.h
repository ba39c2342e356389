// Which paged-attention route a call takes: a pure function of the shapes,
// dtypes, sequence lengths, compute units and environment, shared by eval_gpu
// (Metal), eval_cpu (Linux) and the diagnostics. The rules are documented in
// docs/kernels.md ("Dispatch").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vllm_metal::dispatch {

enum class PagedRoute { Varlen, SplitKv, GqaDecode, NaxPrefill };
const char* route_name(PagedRoute route);

enum class KernelDtype { Float16, BFloat16, Float32, Unsupported };
const char* dtype_name(KernelDtype dtype);  // "float16", "bfloat16", "float32"
KernelDtype parse_dtype(const std::string& name);

// Fixed occupancy budget per GPU core used to judge whether a grid fills the GPU.
inline constexpr int kSimdgroupsPerCore = 33;
// Split-KV / GQA scratch allowed per attention call; above it, the general path.
inline constexpr int64_t kMaxScratchBytes = int64_t(512) << 20;

struct PagedProblem {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  KernelDtype query_dtype = KernelDtype::Float32;
  KernelDtype cache_dtype = KernelDtype::Float32;
  std::vector<int32_t> seq_lens;    // context length per sequence, this step's rows included
  std::vector<int32_t> query_lens;  // query rows per sequence
};

struct DispatchEnv {
  int compute_units = 1;            // GPU cores (Metal) or kernel threads (CPU backend)
  bool gqa_decode_disabled = false;  // VLLM_METAL_DISABLE_GQA_DECODE
};

struct PagedDispatch {
  PagedRoute route = PagedRoute::Varlen;
  int partition_size = 0;  // keys per partition (SplitKv, GqaDecode), else 0
  int num_partitions = 1;  // partitions per (row, head): ceil(longest context / partition_size)
  int64_t scratch_bytes = 0;  // fp32 partial (max, exp-sum, output) bytes
  std::string reason;
};

// (num_heads, num_kv_heads, head_size) has a GQA decode kernel.
bool is_gqa_decode_geometry(int num_heads, int num_kv_heads, int head_size);
bool is_kernel_block_size(int block_size);

// Complete partitions of `partition_size` keys summed over query rows, times
// num_heads: the simdgroups of split work (a ragged tail is not counted).
int64_t complete_partition_work(const PagedProblem& problem, int partition_size);

PagedDispatch decide_paged_dispatch(const PagedProblem& problem, const DispatchEnv& env);

}  // namespace vllm_metal::dispatch
