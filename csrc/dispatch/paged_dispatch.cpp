#include "dispatch/paged_dispatch.h"

#include <algorithm>
#include <stdexcept>

#include "constants.h"
#include "kernel_constants.h"

namespace vllm_metal::dispatch {

namespace {

struct Geometry {
  int num_heads, num_kv_heads, head_size;
};

#define VLLM_METAL_GEOMETRY_ITEM(unused, geometry) Geometry{VLLM_METAL_UNPACK geometry},
constexpr Geometry kGqaGeometries[] = {VLLM_METAL_FOR_EACH_GQA_GEOMETRY(VLLM_METAL_GEOMETRY_ITEM, _)};
#undef VLLM_METAL_GEOMETRY_ITEM

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int longest(const std::vector<int32_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// 512-key partitions when they alone fill the budget (fewer partials to merge),
// else 256 (twice the parallel work).
int choose_partition(const PagedProblem& p, int64_t budget) {
  return complete_partition_work(p, kPartitionSize) >= budget ? kPartitionSize : kPartitionSize / 2;
}

int64_t scratch_bytes(int64_t rows, int num_heads, int num_partitions, int head_size) {
  return num_partitions > 1 ? rows * num_heads * num_partitions * int64_t(head_size + 2) * 4 : 0;
}

std::string describe(int partition, int partitions, int64_t scratch) {
  return std::to_string(partitions) + " partition(s) of " + std::to_string(partition) + " keys, " +
      std::to_string(scratch >> 10) + " KiB scratch";
}

// Keys each sequence attends: its context, or its window.
std::vector<int32_t> attended_spans(const PagedProblem& p, int sliding_window) {
  std::vector<int32_t> spans(p.seq_lens);
  if (sliding_window > 0) {
    for (int32_t& s : spans) s = std::min(s, sliding_window);
  }
  return spans;
}

// A few query rows per sequence: their work is as small as a decode step's, so
// the keys are shared among the threads as decode's are (the general rule
// counts (row, head) pairs against a GPU's simdgroups and would leave a
// single verification query on one thread).
PagedDispatch cpu_short_query_dispatch(const PagedProblem& p, const DispatchEnv& env, int sliding_window) {
  const std::vector<int32_t> spans = attended_spans(p, sliding_window);
  const int num_seqs = static_cast<int>(spans.size());
  const int partition = cpu_decode_partition(spans.data(), num_seqs, env.compute_units);
  int parts = 1;
  int64_t total_q = 0;
  for (int s = 0; s < num_seqs; ++s) {
    parts = std::max(parts, static_cast<int>(ceil_div(std::max<int32_t>(spans[s], 1), partition)));
    total_q += p.query_lens[s];
  }
  PagedDispatch d;
  const int64_t scratch = scratch_bytes(total_q, p.num_heads, parts, p.head_size);
  if (parts < 2 || scratch > kMaxScratchBytes) {
    d.reason = "CPU short queries: one piece per sequence for " + std::to_string(env.compute_units) + " thread(s)";
    return d;
  }
  d.route = PagedRoute::SplitKv;
  d.partition_size = partition;
  d.num_partitions = parts;
  d.scratch_bytes = scratch;
  d.reason = "CPU short queries: " + describe(partition, parts, scratch) + " for " +
      std::to_string(env.compute_units) + " thread(s)";
  return d;
}

// Why a batch does not take NaxPrefill ("" when it does): a prefill-dominated
// batch (at least half of its rows in sequences of a whole tile or more) of a
// float16/bfloat16 float cache in the kernel's head sizes and block sizes.
std::string nax_refusal(const PagedProblem& p, const DispatchEnv& env, int64_t total_q) {
  if (!env.nax_available) return "no tensor units";
  if (env.nax_disabled) return "NAX prefill disabled (VLLM_METAL_DISABLE_NAX_PREFILL)";
  const std::string shape = nax_shape_refusal(p);
  if (!shape.empty()) return shape;
  if (total_q < kNaxMinRows) return "fewer than " + std::to_string(kNaxMinRows) + " query rows";
  int64_t tile_rows = 0;
  for (int32_t q : p.query_lens) tile_rows += q >= kNaxTileRows ? q : 0;
  if (2 * tile_rows < total_q) return "not prefill-dominated (rows in sequences of >= 64 rows: " +
      std::to_string(tile_rows) + " of " + std::to_string(total_q) + ")";
  return "";
}

}  // namespace

bool is_nax_head_size(int head_size) {
#define VLLM_METAL_NAX_HEAD_ITEM(unused, hd) head_size == hd ||
  return VLLM_METAL_FOR_EACH_NAX_HEAD_SIZE(VLLM_METAL_NAX_HEAD_ITEM, _) false;
#undef VLLM_METAL_NAX_HEAD_ITEM
}

std::string nax_shape_refusal(const PagedProblem& p) {
  if (!is_nax_head_size(p.head_size)) return "no NAX prefill kernel for head size " + std::to_string(p.head_size);
  if (p.kv_quant != 0) return "NAX prefill reads float caches only";
  if (p.query_dtype != p.cache_dtype ||
      (p.query_dtype != KernelDtype::Float16 && p.query_dtype != KernelDtype::BFloat16)) {
    return "NAX prefill takes float16 or bfloat16 queries and caches";
  }
  if (!is_kernel_block_size(p.block_size)) return "block size " + std::to_string(p.block_size) + " is not a kernel block size";
  return "";
}

int64_t nax_prefill_tiles(const std::vector<int32_t>& query_lens) {
  int64_t tiles = 0;
  for (int32_t q : query_lens) tiles += ceil_div(std::max<int32_t>(q, 0), kNaxTileRows);
  return tiles;
}

const char* route_name(PagedRoute route) {
  switch (route) {
    case PagedRoute::Varlen:
      return "Varlen";
    case PagedRoute::SplitKv:
      return "SplitKv";
    case PagedRoute::GqaDecode:
      return "GqaDecode";
    case PagedRoute::NaxPrefill:
      return "NaxPrefill";
  }
  return "?";
}

const char* dtype_name(KernelDtype dtype) {
  switch (dtype) {
    case KernelDtype::Float16:
      return "float16";
    case KernelDtype::BFloat16:
      return "bfloat16";
    case KernelDtype::Float32:
      return "float32";
    default:
      return "unsupported";
  }
}

KernelDtype parse_dtype(const std::string& name) {
  if (name == "float16") return KernelDtype::Float16;
  if (name == "bfloat16") return KernelDtype::BFloat16;
  if (name == "float32") return KernelDtype::Float32;
  throw std::invalid_argument("dtype must be 'float16', 'bfloat16' or 'float32', got '" + name + "'");
}

bool is_gqa_decode_geometry(int num_heads, int num_kv_heads, int head_size) {
  for (const Geometry& g : kGqaGeometries) {
    if (g.num_heads == num_heads && g.num_kv_heads == num_kv_heads && g.head_size == head_size) return true;
  }
  return false;
}

bool is_kernel_block_size(int block_size) {
  for (int b : kKernelBlockSizes) {
    if (b == block_size) return true;
  }
  return false;
}

int64_t complete_partition_work(const PagedProblem& p, int partition_size) {
  int64_t partitions = 0;
  for (size_t s = 0; s < p.seq_lens.size(); ++s) {
    partitions += int64_t(p.query_lens[s]) * (p.seq_lens[s] / partition_size);
  }
  return partitions * p.num_heads;
}

PagedDispatch decide_paged_dispatch(const PagedProblem& p, const DispatchEnv& env) {
  if (p.seq_lens.size() != p.query_lens.size()) {
    throw std::invalid_argument("paged dispatch: seq_lens and query_lens differ in length");
  }
  const int num_seqs = static_cast<int>(p.seq_lens.size());
  int64_t total_q = 0;
  bool decode = num_seqs > 0;
  for (int s = 0; s < num_seqs; ++s) {
    total_q += p.query_lens[s];
    decode = decode && p.query_lens[s] == 1;
  }
  PagedDispatch d;
  if (total_q == 0) {
    d.reason = "no query rows";
    return d;
  }
  const int64_t budget = int64_t(kSimdgroupsPerCore) * std::max(env.compute_units, 1);
  const int max_context = longest(p.seq_lens);

  if (decode) {
    std::string why_not;
    if (env.gqa_decode_disabled) {
      why_not = "GQA decode disabled (VLLM_METAL_DISABLE_GQA_DECODE)";
    } else if (!is_gqa_decode_geometry(p.num_heads, p.num_kv_heads, p.head_size)) {
      why_not = "no GQA decode kernel for (" + std::to_string(p.num_heads) + ", " +
          std::to_string(p.num_kv_heads) + ", " + std::to_string(p.head_size) + ")";
    } else if (!is_kernel_block_size(p.block_size)) {
      why_not = "block size " + std::to_string(p.block_size) + " is not a kernel block size";
    } else if (p.query_dtype != p.cache_dtype || p.cache_dtype == KernelDtype::Unsupported) {
      why_not = "query and cache dtypes differ";
    } else {
      for (int partition : {choose_partition(p, budget), kPartitionSize}) {
        const int parts = static_cast<int>(ceil_div(std::max(max_context, 1), partition));
        const int64_t scratch = scratch_bytes(num_seqs, p.num_heads, parts, p.head_size);
        if (scratch <= kMaxScratchBytes) {
          d.route = PagedRoute::GqaDecode;
          d.partition_size = partition;
          d.num_partitions = parts;
          d.scratch_bytes = scratch;
          d.reason = "GQA decode: " + describe(partition, parts, scratch);
          return d;
        }
      }
      why_not = "GQA scratch above 512 MiB";
    }
    d.reason = why_not + "; ";
  }

  if (!decode) {
    const std::string why_not = nax_refusal(p, env, total_q);
    if (why_not.empty()) {
      d.route = PagedRoute::NaxPrefill;
      d.reason = "NAX prefill: " + std::to_string(nax_prefill_tiles(p.query_lens)) + " tile(s) of " +
          std::to_string(kNaxTileRows) + " rows";
      return d;
    }
    if (env.nax_available) d.reason += why_not + "; ";
  }

  // General path: split long contexts when one threadgroup per (row, head)
  // leaves the GPU (or the CPU threads) under-filled.
  if (total_q * p.num_heads < budget) {
    for (int partition : {choose_partition(p, budget), kPartitionSize}) {
      const int parts = static_cast<int>(ceil_div(std::max(max_context, 1), partition));
      if (parts < 2) break;
      const int64_t scratch = scratch_bytes(total_q, p.num_heads, parts, p.head_size);
      if (scratch <= kMaxScratchBytes) {
        d.route = PagedRoute::SplitKv;
        d.partition_size = partition;
        d.num_partitions = parts;
        d.scratch_bytes = scratch;
        d.reason += "split-KV: " + describe(partition, parts, scratch);
        return d;
      }
    }
  }
  d.reason += "varlen: " + std::to_string(total_q * p.num_heads) + " (row, head) pairs, budget " +
      std::to_string(budget);
  return d;
}

int cpu_decode_partition(const int32_t* spans, int num_seqs, int threads) {
  int64_t total = 0;
  int longest_span = 1;
  for (int s = 0; s < num_seqs; ++s) {
    total += std::max(spans[s], 0);
    longest_span = std::max(longest_span, static_cast<int>(spans[s]));
  }
  if (threads <= 1) return longest_span;  // one thread: splitting only adds merges
  const int64_t share = ceil_div(total, int64_t(threads) * kCpuPiecesPerThread);
  return static_cast<int>(std::clamp<int64_t>(share, kCpuMinPiece, std::max(longest_span, kCpuMinPiece)));
}

PagedDispatch decide_cpu_paged_dispatch(const PagedProblem& p, const DispatchEnv& env, int sliding_window) {
  if (p.seq_lens.size() != p.query_lens.size()) {
    throw std::invalid_argument("paged dispatch: seq_lens and query_lens differ in length");
  }
  const int num_seqs = static_cast<int>(p.seq_lens.size());
  bool decode = num_seqs > 0;
  for (int s = 0; s < num_seqs && decode; ++s) decode = p.query_lens[s] == 1;
  bool short_queries = num_seqs > 0 && !decode;
  for (int s = 0; s < num_seqs && short_queries; ++s) short_queries = p.query_lens[s] <= kCpuShortQueryRows;
  if (short_queries) return cpu_short_query_dispatch(p, env, sliding_window);
  if (!decode || env.gqa_decode_disabled) {
    PagedDispatch d = decide_paged_dispatch(p, env);
    if (decode) d.reason = "GQA decode disabled (VLLM_METAL_DISABLE_GQA_DECODE); " + d.reason;
    return d;
  }
  const std::vector<int32_t> spans = attended_spans(p, sliding_window);
  PagedDispatch d;
  d.route = PagedRoute::GqaDecode;
  d.partition_size = cpu_decode_partition(spans.data(), num_seqs, env.compute_units);
  int64_t pieces = 0;
  for (int32_t s : spans) {
    const int n = static_cast<int>(ceil_div(std::max(s, 1), d.partition_size));
    d.num_partitions = std::max(d.num_partitions, n);
    pieces += n > 1 ? n : 0;
  }
  d.scratch_bytes = pieces * p.num_heads * int64_t(p.head_size + 2) * 4;
  d.reason = "CPU GQA decode: up to " + describe(d.partition_size, d.num_partitions, d.scratch_bytes) + " for " +
      std::to_string(env.compute_units) + " thread(s)";
  return d;
}

}  // namespace vllm_metal::dispatch
