// Which paged-attention route a call takes: a pure function of the shapes,
// dtypes, sequence lengths, compute units and environment, shared by eval_gpu
// (Metal), eval_cpu (Linux; its own rule for pure decode batches) and the
// diagnostics. The rules are documented in docs/kernels.md ("Dispatch") and,
// for the CPU's decode rule, docs/gqa-decode.md ("The CPU counterpart").
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
  KernelDtype cache_dtype = KernelDtype::Float32;  // a quantized cache: the query's
  int kv_quant = 0;  // a KvQuant (csrc/kv_quant.h): the cache holds codes and scales
  std::vector<int32_t> seq_lens;    // context length per sequence, this step's rows included
  std::vector<int32_t> query_lens;  // query rows per sequence
};

struct DispatchEnv {
  int compute_units = 1;            // GPU cores (Metal) or kernel threads (CPU backend)
  bool gqa_decode_disabled = false;  // VLLM_METAL_DISABLE_GQA_DECODE
  // The GPU has tensor units (MLX's is_nax_available) and a tensor-op library is
  // loaded (metal/nax_readiness.h); always false on the CPU backend.
  bool nax_available = false;
  bool nax_disabled = false;  // VLLM_METAL_DISABLE_NAX_PREFILL
};

struct PagedDispatch {
  PagedRoute route = PagedRoute::Varlen;
  int partition_size = 0;  // keys per partition (SplitKv, GqaDecode), else 0
  int num_partitions = 1;  // partitions per (row, head): ceil(longest context / partition_size)
  int64_t scratch_bytes = 0;  // fp32 partial (max, exp-sum, output) bytes
  std::string reason;
};

// The NaxPrefill kernel (kernels_v2/paged_attention_nax_prefill.h): query rows of
// a threadgroup's tile (kNaxTileRows, of one sequence) and the fewest query rows
// of a launch (a simdgroup's view of kNaxMinRows rows stays inside the query).
inline constexpr int kNaxTileRows = 64;
inline constexpr int kNaxMinRows = 16;
bool is_nax_head_size(int head_size);
// Why the NaxPrefill kernels do not cover this shape ("" when they do): head size,
// float16/bfloat16 query = cache, no quantized cache, a kernel block size.
std::string nax_shape_refusal(const PagedProblem& problem);
// Threadgroup tiles of a batch: sum over sequences of ceil(query rows / kNaxTileRows).
int64_t nax_prefill_tiles(const std::vector<int32_t>& query_lens);

// (num_heads, num_kv_heads, head_size) has a GQA decode kernel.
bool is_gqa_decode_geometry(int num_heads, int num_kv_heads, int head_size);
bool is_kernel_block_size(int block_size);

// Complete partitions of `partition_size` keys summed over query rows, times
// num_heads: the simdgroups of split work (a ragged tail is not counted).
int64_t complete_partition_work(const PagedProblem& problem, int partition_size);

PagedDispatch decide_paged_dispatch(const PagedProblem& problem, const DispatchEnv& env);

// The CPU backend's decision (env.compute_units = kernel threads). Pure
// decode batches take GqaDecode whenever it is not disabled: the CPU kernel
// serves every geometry, block size and dtype pair, and its partitions are cut
// to share the keys evenly among the threads (cpu_decode_partition) rather
// than to fill a GPU. Batches of short queries (every sequence at most
// kCpuShortQueryRows rows: speculative verification, small prefill chunks)
// cut their keys the same way, through SplitKv; every other batch follows
// decide_paged_dispatch.
// sliding_window > 0 limits each row to its last sliding_window keys.
PagedDispatch decide_cpu_paged_dispatch(const PagedProblem& problem, const DispatchEnv& env, int sliding_window = 0);

// Keys per partition of CPU GQA decode: about 1 / (kCpuPiecesPerThread x
// threads) of all keys to attend, at least kCpuMinPiece, so that equal pieces
// keep every thread busy; a sequence of `span` keys is cut into
// ceil(span / partition) equal pieces. spans: keys each sequence attends.
inline constexpr int kCpuPiecesPerThread = 2;
inline constexpr int kCpuMinPiece = 64;
// Query rows per sequence up to which a CPU batch counts as short queries (the
// pieces kernel takes that many rows per item: kPieceRows, paged_pieces_cpu.h).
inline constexpr int kCpuShortQueryRows = 16;
int cpu_decode_partition(const int32_t* spans, int num_seqs, int threads);

}  // namespace vllm_metal::dispatch
