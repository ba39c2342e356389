// The Metal launches of a dispatch decision: kernel names (built exactly as the
// instantiation macros in kernels_v2/*.metal build them), grids, threadgroup
// sizes, function constants and the parameter block. Pure, so Linux tests run
// the same plan on the MSL harness that eval_gpu encodes on a Mac.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/paged_dispatch.h"
#include "paged_attention_params.h"

namespace vllm_metal::dispatch {

struct KernelLaunch {
  std::string kernel;
  std::array<uint32_t, 3> grid;     // threadgroups
  std::array<uint32_t, 3> threads;  // threads per threadgroup
  // Values of the function constants use_sliding_window, use_softcap,
  // use_sinks, write_partials (indices VLLM_METAL_FC_*), if the kernel has them.
  std::array<bool, 4> constants;
  bool specialized = true;
  // Function constant kv_quant (VLLM_METAL_FC_KV_QUANT, an int): the cache's
  // KvQuant, set with the others when specialized.
  int kv_quant = 0;
  // The kernel is in the tensor-op library (Metal 4; metal/kernel_library.h),
  // not the main one.
  bool tensor_ops = false;
};

struct PagedAttentionFeatures {
  float scale = 1.0f;
  int sliding_window = 0;  // 0 = off
  float softcap = 0.0f;    // 0 = off
  bool has_sinks = false;
  int max_blocks_per_seq = 0;
  bool has_key_ends = false;  // buffer(11): each query row's key end
};

struct PagedAttentionPlan {
  std::vector<KernelLaunch> launches;
  kernels::PagedAttentionParams params;
  int64_t partial_rows = 0;  // rows of the scratch buffers (0: none)
  int num_partitions = 1;
};

struct ReshapeAndCachePlan {
  KernelLaunch launch;
  kernels::ReshapeAndCacheParams params;
};

std::string varlen_kernel_name(KernelDtype dtype, int head_size, int block_size);
std::string gqa_decode_kernel_name(KernelDtype dtype, int num_heads, int num_kv_heads, int head_size, int block_size);
std::string reduce_kernel_name(KernelDtype dtype, int head_size);
std::string nax_prefill_kernel_name(KernelDtype dtype, int head_size, int block_size);
std::string reshape_and_cache_kernel_name(KernelDtype dtype, bool quantized);

// Head sizes with a varlen / reduce kernel.
const std::vector<int>& varlen_head_sizes();
// (num_heads, num_kv_heads, head_size) triples with a GQA decode kernel.
const std::vector<std::array<int, 3>>& gqa_decode_geometries();

// The Metal kernels cover this shape (else the op runs on the CPU stream).
bool metal_supports(const PagedProblem& problem);

PagedAttentionPlan plan_paged_attention(
    const PagedProblem& problem,
    const PagedDispatch& dispatch,
    const PagedAttentionFeatures& features);

// dtype: of the K/V rows (and of a float cache). kv_quant > 0: the cache holds
// codes and scales (csrc/kv_quant.h), head rows of head_size.
ReshapeAndCachePlan plan_reshape_and_cache(KernelDtype dtype, int num_tokens, int row_elems, int num_slots,
                                           int kv_quant = 0, int head_size = 0);

// Throws std::runtime_error naming the kernel and both counts if `launch` asks
// for more threads per threadgroup than its pipeline allows. The limit
// (maxTotalThreadsPerThreadgroup) depends on the compiled kernel's register and
// threadgroup memory use, so only the device knows it, and a launch beyond it
// is invalid Metal usage with undefined results.
void check_threadgroup_size(const KernelLaunch& launch, uint64_t max_total_threads);

}  // namespace vllm_metal::dispatch
