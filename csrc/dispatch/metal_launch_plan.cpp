#include "dispatch/metal_launch_plan.h"

#include <algorithm>
#include <stdexcept>

#include "constants.h"
#include "kernel_constants.h"
#include "kv_quant.h"

namespace vllm_metal::dispatch {

namespace {

constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kVarlenThreads = 4 * kSimdWidth;  // kVarlenSimdgroups in the kernel

uint32_t u32(int64_t v) {
  if (v < 0 || v > int64_t(UINT32_MAX)) throw std::invalid_argument("launch dimension out of range");
  return static_cast<uint32_t>(v);
}

}  // namespace

std::string varlen_kernel_name(KernelDtype dtype, int head_size, int block_size) {
  return std::string("paged_attention_varlen_") + dtype_name(dtype) + "_hd" + std::to_string(head_size) +
      "_bs" + std::to_string(block_size);
}

std::string gqa_decode_kernel_name(KernelDtype dtype, int num_heads, int num_kv_heads, int head_size, int block_size) {
  return std::string("paged_attention_gqa_decode_") + dtype_name(dtype) + "_hq" + std::to_string(num_heads) +
      "_hkv" + std::to_string(num_kv_heads) + "_hd" + std::to_string(head_size) + "_bs" + std::to_string(block_size);
}

std::string nax_prefill_kernel_name(KernelDtype dtype, int head_size, int block_size) {
  return std::string("paged_attention_nax_prefill_") + dtype_name(dtype) + "_hd" + std::to_string(head_size) +
      "_bs" + std::to_string(block_size);
}

std::string reduce_kernel_name(KernelDtype dtype, int head_size) {
  return std::string("paged_attention_v2_reduce_") + dtype_name(dtype) + "_hd" + std::to_string(head_size);
}

std::string reshape_and_cache_kernel_name(KernelDtype dtype, bool quantized) {
  return std::string(quantized ? "reshape_and_cache_quant_" : "reshape_and_cache_") + dtype_name(dtype);
}

const std::vector<int>& varlen_head_sizes() {
#define VLLM_METAL_HEAD_ITEM(unused, hd) hd,
  static const std::vector<int> sizes = {VLLM_METAL_FOR_EACH_HEAD_SIZE(VLLM_METAL_HEAD_ITEM, _)};
#undef VLLM_METAL_HEAD_ITEM
  return sizes;
}

const std::vector<std::array<int, 3>>& gqa_decode_geometries() {
#define VLLM_METAL_GEOMETRY_ITEM(unused, geometry) std::array<int, 3>{VLLM_METAL_UNPACK geometry},
  static const std::vector<std::array<int, 3>> geometries = {
      VLLM_METAL_FOR_EACH_GQA_GEOMETRY(VLLM_METAL_GEOMETRY_ITEM, _)};
#undef VLLM_METAL_GEOMETRY_ITEM
  return geometries;
}

bool metal_supports(const PagedProblem& p) {
  const auto& sizes = varlen_head_sizes();
  return p.cache_dtype != KernelDtype::Unsupported && p.query_dtype == p.cache_dtype &&
      is_kernel_block_size(p.block_size) && std::find(sizes.begin(), sizes.end(), p.head_size) != sizes.end();
}

PagedAttentionPlan plan_paged_attention(
    const PagedProblem& p,
    const PagedDispatch& d,
    const PagedAttentionFeatures& f) {
  if (!metal_supports(p)) throw std::invalid_argument("no Metal kernels for this paged-attention shape");
  int64_t total_q = 0;
  for (int32_t q : p.query_lens) total_q += q;
  const int num_seqs = static_cast<int>(p.seq_lens.size());
  const bool window = f.sliding_window > 0;
  const bool softcap = f.softcap > 0.0f;
  const bool split = d.num_partitions > 1;

  PagedAttentionPlan plan;
  plan.num_partitions = d.num_partitions;
  plan.partial_rows = split ? total_q : 0;
  plan.params.num_seqs = num_seqs;
  plan.params.num_heads = p.num_heads;
  plan.params.num_kv_heads = p.num_kv_heads;
  plan.params.max_blocks_per_seq = f.max_blocks_per_seq;
  plan.params.partition_size = d.partition_size > 0 ? d.partition_size : kPartitionSize;
  plan.params.num_partitions = d.num_partitions;
  plan.params.sliding_window = f.sliding_window;
  plan.params.scale = f.scale;
  plan.params.softcap = f.softcap;
  plan.params.use_key_ends = f.has_key_ends ? 1 : 0;

  const std::array<uint32_t, 3> one_simdgroup = {kSimdWidth, 1, 1};
  if (d.route == PagedRoute::GqaDecode) {
    if (total_q != num_seqs) throw std::invalid_argument("GQA decode needs one query row per sequence");
    const uint32_t group = u32(p.num_heads / p.num_kv_heads);
    plan.launches.push_back(
        {gqa_decode_kernel_name(p.cache_dtype, p.num_heads, p.num_kv_heads, p.head_size, p.block_size),
         {u32(p.num_kv_heads), u32(num_seqs), u32(d.num_partitions)},
         {group * kSimdWidth, 1, 1},
         {window, softcap, f.has_sinks, split},
         true,
         p.kv_quant});
  } else if (d.route == PagedRoute::Varlen || d.route == PagedRoute::SplitKv) {
    plan.launches.push_back(
        {varlen_kernel_name(p.cache_dtype, p.head_size, p.block_size),
         {u32(p.num_heads), u32(total_q), u32(d.num_partitions)},
         {kVarlenThreads, 1, 1},
         {window, softcap, f.has_sinks, split},
         true,
         p.kv_quant});
  } else if (d.route == PagedRoute::NaxPrefill) {
    const std::string why_not = nax_shape_refusal(p);
    if (!why_not.empty()) throw std::invalid_argument("NaxPrefill: " + why_not);
    if (split) throw std::invalid_argument("NaxPrefill writes no partials");
    if (total_q < kNaxMinRows) throw std::invalid_argument("NaxPrefill needs at least 16 query rows");
    plan.launches.push_back(
        {nax_prefill_kernel_name(p.cache_dtype, p.head_size, p.block_size),
         {u32(p.num_heads), u32(nax_prefill_tiles(p.query_lens)), 1},
         {kVarlenThreads, 1, 1},  // kNaxSimdgroups in the kernel
         {window, softcap, f.has_sinks, false},
         true,
         0,
         true});
  } else {
    throw std::invalid_argument(std::string("route ") + route_name(d.route) + " has no Metal kernels");
  }
  if (split) {
    plan.launches.push_back(
        {reduce_kernel_name(p.cache_dtype, p.head_size),
         {u32(p.num_heads), u32(total_q), 1},
         one_simdgroup,
         {window, softcap, f.has_sinks, true}});
  }
  return plan;
}

ReshapeAndCachePlan plan_reshape_and_cache(KernelDtype dtype, int num_tokens, int row_elems, int num_slots,
                                           int kv_quant, int head_size) {
  ReshapeAndCachePlan plan;
  plan.params.row_elems = row_elems;
  plan.params.num_slots = num_slots;
  plan.params.head_size = head_size;
  if (kv_quant != 0) {
    if (head_size < 1 || row_elems % head_size != 0) {
      throw std::invalid_argument("a quantized cache write needs the head size (a divisor of the row)");
    }
    if (!kv_head_size_ok(head_size, static_cast<KvQuant>(kv_quant))) {
      throw std::invalid_argument("a cache of 4-bit rows takes head sizes 64, 128, 256");
    }
    // One simdgroup per (token, KV head) row.
    plan.launch = {reshape_and_cache_kernel_name(dtype, true), {u32(num_tokens), u32(row_elems / head_size), 1},
                   {kSimdWidth, 1, 1}, {false, false, false, false}, true, kv_quant};
    return plan;
  }
  const uint32_t threads = std::clamp<uint32_t>((u32(row_elems) + kSimdWidth - 1) / kSimdWidth * kSimdWidth,
                                                kSimdWidth, 256);
  plan.launch = {reshape_and_cache_kernel_name(dtype, false), {u32(num_tokens), 1, 1}, {threads, 1, 1},
                 {false, false, false, false}, false};
  return plan;
}

void check_threadgroup_size(const KernelLaunch& launch, uint64_t max_total_threads) {
  const uint64_t threads = uint64_t(launch.threads[0]) * launch.threads[1] * launch.threads[2];
  if (threads > max_total_threads) {
    throw std::runtime_error("vllm-metal: kernel " + launch.kernel + " is launched with " + std::to_string(threads) +
                             " threads per threadgroup, but its pipeline allows at most " +
                             std::to_string(max_total_threads) + " on this device");
  }
}

}  // namespace vllm_metal::dispatch
