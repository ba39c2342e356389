#include "dispatch/dispatch_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>

#include "constants.h"
#include "cpu/attention/paged_attention_cpu.h"
#include "dispatch/diagnostics.h"
#include "dispatch/dispatch_env.h"
#include "dispatch/metal_launch_plan.h"
#include "kernel_constants.h"
#include "dispatch/paged_dispatch.h"
#include "dispatch/paged_metadata.h"
#include "dispatch/launch_dict.h"
#include "metal/kernel_library.h"
#include "metal/nax_readiness.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vllm_metal {

namespace {

using dispatch::PagedRoute;

PagedRoute parse_route(const std::string& name) {
  for (PagedRoute r : {PagedRoute::Varlen, PagedRoute::SplitKv, PagedRoute::GqaDecode, PagedRoute::NaxPrefill}) {
    if (name == dispatch::route_name(r)) return r;
  }
  throw std::invalid_argument("route must be 'Varlen', 'SplitKv', 'GqaDecode' or 'NaxPrefill', got '" + name + "'");
}

dispatch::PagedProblem make_problem(
    const std::vector<int32_t>& seq_lens,
    const std::vector<int32_t>& query_lens,
    int num_heads,
    int num_kv_heads,
    int head_size,
    int block_size,
    const std::string& dtype,
    const std::optional<std::string>& query_dtype) {
  if (seq_lens.size() != query_lens.size()) {
    throw std::invalid_argument("seq_lens and query_lens must have the same length");
  }
  if (num_heads < 1 || num_kv_heads < 1 || num_heads % num_kv_heads != 0) {
    throw std::invalid_argument("num_heads must be a positive multiple of num_kv_heads");
  }
  if (head_size < 1 || block_size < 1) throw std::invalid_argument("head_size and block_size must be >= 1");
  dispatch::PagedProblem p;
  p.seq_lens = seq_lens;
  p.query_lens = query_lens;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_size = head_size;
  p.block_size = block_size;
  p.cache_dtype = dispatch::parse_dtype(dtype);
  p.query_dtype = query_dtype ? dispatch::parse_dtype(*query_dtype) : p.cache_dtype;
  return p;
}

nb::dict to_dict(const dispatch::PagedDispatch& d) {
  nb::dict out;
  out["route"] = dispatch::route_name(d.route);
  out["partition_size"] = d.partition_size > 0 ? nb::object(nb::int_(d.partition_size)) : nb::none();
  out["num_partitions"] = d.num_partitions;
  out["scratch_bytes"] = d.scratch_bytes;
  out["reason"] = d.reason;
  return out;
}

nb::dict to_dict(const dispatch::KernelLaunch& l) {
  nb::dict out = launch_dict(l);
  nb::dict constants;
  if (l.specialized) {
    for (int i = 0; i < 4; ++i) constants[nb::int_(i)] = l.constants[i];
    constants[nb::int_(VLLM_METAL_FC_KV_QUANT)] = l.kv_quant;
  }
  out["constants"] = constants;
  return out;
}

using F32Array = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using I32Array = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;

// Benchmarks: time cpu::paged_attention_cpu itself, without MLX's graph and
// stream overheads, cycling over one block table per "layer" so that a call
// meets the pages of the other layers' calls, not its own, in the caches.
nb::tuple time_cpu_paged_attention(const F32Array& query, const F32Array& key_cache, const F32Array& value_cache,
                                   const I32Array& block_tables, const I32Array& seq_lens,
                                   const I32Array& cu_seqlens_q, float scale, int rounds) {
  if (query.ndim() != 3) throw std::invalid_argument("query must be [total_q, num_heads, head_size]");
  if (key_cache.ndim() != 4) throw std::invalid_argument("key_cache must be [num_blocks, block_size, kv_heads, d]");
  for (size_t i = 0; i < 4; ++i) {
    if (value_cache.ndim() != 4 || value_cache.shape(i) != key_cache.shape(i)) {
      throw std::invalid_argument("value_cache must have key_cache's shape");
    }
  }
  if (key_cache.shape(3) != query.shape(2)) throw std::invalid_argument("key_cache head size differs from query's");
  if (block_tables.ndim() != 3) throw std::invalid_argument("block_tables must be [layers, num_seqs, max_blocks]");
  const size_t num_seqs = block_tables.shape(1);
  if (seq_lens.ndim() != 1 || seq_lens.shape(0) != num_seqs) throw std::invalid_argument("seq_lens must be [num_seqs]");
  if (cu_seqlens_q.ndim() != 1 || cu_seqlens_q.shape(0) != num_seqs + 1) {
    throw std::invalid_argument("cu_seqlens_q must be [num_seqs + 1]");
  }
  if (rounds < 1) throw std::invalid_argument("rounds must be >= 1");
  std::vector<float> out(query.size());
  cpu::PagedAttentionArgs a{};
  a.query = query.data();
  a.key_cache = key_cache.data();
  a.value_cache = value_cache.data();
  a.seq_lens = seq_lens.data();
  a.cu_seqlens_q = cu_seqlens_q.data();
  a.out = out.data();
  a.total_q = static_cast<int>(query.shape(0));
  a.num_heads = static_cast<int>(query.shape(1));
  a.head_size = static_cast<int>(query.shape(2));
  a.num_blocks = static_cast<int>(key_cache.shape(0));
  a.block_size = static_cast<int>(key_cache.shape(1));
  a.num_kv_heads = static_cast<int>(key_cache.shape(2));
  a.num_seqs = static_cast<int>(num_seqs);
  a.max_blocks_per_seq = static_cast<int>(block_tables.shape(2));
  a.scale = scale;
  if (a.num_kv_heads < 1 || a.num_heads % a.num_kv_heads != 0) {
    throw std::invalid_argument("num_heads must be a multiple of the cache's kv heads");
  }
  const int layers = static_cast<int>(block_tables.shape(0));
  const int64_t table_size = int64_t(num_seqs) * a.max_blocks_per_seq;
  std::vector<double> seconds;
  dispatch::PagedDispatch d;
  {
    nb::gil_scoped_release release;
    for (int r = 0; r < rounds; ++r) {
      for (int layer = 0; layer < layers; ++layer) {
        a.block_tables = block_tables.data() + layer * table_size;
        const auto start = std::chrono::steady_clock::now();
        d = cpu::paged_attention_cpu(a);
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
  }
  nb::list times;
  for (double s : seconds) times.append(s);
  return nb::make_tuple(times, dispatch::route_name(d.route));
}

template <typename T>
nb::bytes as_bytes(const T& v) {
  return nb::bytes(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

void bind_dispatch(nb::module_& m) {
  m.attr("kernels_hash") = kKernelsHash;

  m.def(
      "metal_head_sizes",
      [] {
        nb::list sizes;
        for (int d : dispatch::varlen_head_sizes()) sizes.append(d);
        return nb::steal(PySequence_Tuple(sizes.ptr()));
      },
      "Head sizes the Metal paged-attention kernels are instantiated for (kernels_v2/kernel_constants.h).");
  m.def("gpu_core_count", &dispatch::gpu_core_count,
        "GPU cores the dispatch budgets for (IORegistry on macOS; the documented fallback elsewhere).");
  m.def(
      "_set_metal_library_path", [](const std::string& path) { metal::set_library_path(path); }, "path"_a,
        "Use this prebuilt .metallib for eval_gpu.");
  m.def(
      "_set_metal_library_source", [](const std::string& source) { metal::set_library_source(source); },
      "source"_a, "JIT-compile this Metal source (kernels_v2 but its tensor-op files, includes inlined) for eval_gpu.");
  m.def(
      "_set_metal_tensor_library_path",
      [](const std::string& path) { metal::set_library_path(path, metal::LibraryKind::TensorOps); }, "path"_a,
      "Use this prebuilt .metallib (Metal 4) for the tensor-op kernels.");
  m.def(
      "_set_metal_tensor_library_source",
      [](const std::string& source) { metal::set_library_source(source, metal::LibraryKind::TensorOps); },
      "source"_a, "JIT-compile this Metal source (kernels_v2's tensor-op files) for the tensor-op kernels.");
  m.def(
      "nax_prefill_status",
      [] {
        const metal::NaxStatus status = metal::nax_prefill_status();
        return nb::make_tuple(status.state, status.detail);
      },
      "(state, detail) of the NaxPrefill route on this machine: 'ready', 'unavailable' (no tensor "
      "units or no tensor-op library) or 'failed' (the library or pipeline did not load: a bug). "
      "Loads the tensor-op library on a Mac with tensor units.");
  m.def("metal_kernels_loaded", &metal::kernels_configured,
        "True once the Metal kernels are configured: the ops may run on the GPU stream.");
}

void bind_dispatch_debug(nb::module_& m) {
  m.def("set_paged_dispatch_diagnostics", &dispatch::set_paged_dispatch_diagnostics, "enabled"_a,
        "Record the route of every paged-attention call (and forget the last one).");
  m.def("last_paged_dispatch", &dispatch::last_paged_dispatch,
        "Route of the most recent recorded paged-attention call: 'GqaDecode', 'SplitKv', "
        "'Varlen' (or 'NaxPrefill'); None if none was recorded.");
  m.def("last_gqa_partition_size", &dispatch::last_gqa_partition_size,
        "Keys per partition of the last recorded call if it took GqaDecode (256 or 512 on Metal, "
        "the even piece size on the CPU backend), else None.");

  m.def("nax_prefill_disabled", &dispatch::nax_prefill_disabled,
        "VLLM_METAL_DISABLE_NAX_PREFILL as eval_gpu reads it (ValueError for a non-boolean).");

  m.def(
      "paged_dispatch",
      [](const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& query_lens, int num_heads,
         int num_kv_heads, int head_size, int block_size, const std::string& dtype,
         const std::optional<std::string>& query_dtype, int compute_units, bool gqa_decode_disabled,
         bool nax_available, bool nax_disabled, int kv_quant) {
        auto p = make_problem(seq_lens, query_lens, num_heads, num_kv_heads, head_size, block_size, dtype,
                              query_dtype);
        p.kv_quant = kv_quant;
        return to_dict(dispatch::decide_paged_dispatch(
            p, {compute_units, gqa_decode_disabled, nax_available, nax_disabled}));
      },
      "seq_lens"_a, "query_lens"_a, "num_heads"_a, "num_kv_heads"_a, "head_size"_a, "block_size"_a,
      "dtype"_a, "query_dtype"_a = nb::none(), "compute_units"_a, "gqa_decode_disabled"_a = false,
      "nax_available"_a = false, "nax_disabled"_a = false, "kv_quant"_a = 0,
      "The dispatch decision (dict: route, partition_size, num_partitions, scratch_bytes, reason); "
      "nax_available: the GPU's tensor units and the NaxPrefill kernels are there.");

  m.def(
      "cpu_paged_dispatch",
      [](const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& query_lens, int num_heads,
         int num_kv_heads, int head_size, int block_size, const std::string& dtype,
         const std::optional<std::string>& query_dtype, int threads, bool gqa_decode_disabled, int sliding_window) {
        auto p = make_problem(seq_lens, query_lens, num_heads, num_kv_heads, head_size, block_size, dtype,
                              query_dtype);
        if (threads < 1) throw std::invalid_argument("threads must be >= 1");
        if (sliding_window < 0) throw std::invalid_argument("sliding_window must be >= 0");
        return to_dict(dispatch::decide_cpu_paged_dispatch(p, {threads, gqa_decode_disabled}, sliding_window));
      },
      "seq_lens"_a, "query_lens"_a, "num_heads"_a, "num_kv_heads"_a, "head_size"_a, "block_size"_a,
      "dtype"_a, "query_dtype"_a = nb::none(), "threads"_a, "gqa_decode_disabled"_a = false,
      "sliding_window"_a = 0,
      "The CPU backend's dispatch decision for this many kernel threads (dict as paged_dispatch).");

  m.def(
      "metal_launch_plan",
      [](const std::vector<int32_t>& seq_lens, const std::vector<int32_t>& query_lens, int num_heads,
         int num_kv_heads, int head_size, int block_size, const std::string& dtype, const std::string& route,
         int partition_size, float scale, int sliding_window, float softcap, bool has_sinks,
         int max_blocks_per_seq, int kv_quant, bool has_key_ends) {
        auto p = make_problem(seq_lens, query_lens, num_heads, num_kv_heads, head_size, block_size, dtype,
                              std::nullopt);
        p.kv_quant = kv_quant;
        dispatch::PagedDispatch d;
        d.route = parse_route(route);
        if (d.route != PagedRoute::Varlen && d.route != PagedRoute::NaxPrefill) {
          if (partition_size < 1) throw std::invalid_argument("partition_size must be >= 1");
          int longest = 1;
          for (int32_t s : seq_lens) longest = std::max<int>(longest, s);
          d.partition_size = partition_size;
          d.num_partitions = (longest + partition_size - 1) / partition_size;
        }
        dispatch::PagedAttentionFeatures f{scale, sliding_window, softcap, has_sinks, max_blocks_per_seq,
                                           has_key_ends};
        const auto plan = dispatch::plan_paged_attention(p, d, f);
        nb::list launches;
        for (const auto& l : plan.launches) launches.append(to_dict(l));
        nb::dict out;
        out["launches"] = launches;
        out["params"] = as_bytes(plan.params);
        out["partial_rows"] = plan.partial_rows;
        out["num_partitions"] = plan.num_partitions;
        return out;
      },
      "seq_lens"_a, "query_lens"_a, "num_heads"_a, "num_kv_heads"_a, "head_size"_a, "block_size"_a,
      "dtype"_a, "route"_a, "partition_size"_a = kPartitionSize, "scale"_a, "sliding_window"_a = 0,
      "softcap"_a = 0.0f, "has_sinks"_a = false, "max_blocks_per_seq"_a, "kv_quant"_a = 0,
      "has_key_ends"_a = false,
      "The Metal launches eval_gpu encodes for this route (dict: launches, params bytes, partial_rows, "
      "num_partitions); kv_quant > 0: a quantized cache of codes and scales; has_key_ends: buffer(11) "
      "holds each query row's key end.");

  m.def(
      "reshape_and_cache_plan",
      [](const std::string& dtype, int num_tokens, int row_elems, int num_slots, int kv_quant, int head_size) {
        const auto plan = dispatch::plan_reshape_and_cache(dispatch::parse_dtype(dtype), num_tokens, row_elems,
                                                           num_slots, kv_quant, head_size);
        nb::dict out;
        out["launch"] = to_dict(plan.launch);
        out["params"] = as_bytes(plan.params);
        return out;
      },
      "dtype"_a, "num_tokens"_a, "row_elems"_a, "num_slots"_a, "kv_quant"_a = 0, "head_size"_a = 0,
      "The Metal launch of reshape_and_cache (kv_quant > 0: into a quantized cache).");

  m.def(
      "kernel_shapes",
      [] {
        nb::dict out;
        out["head_sizes"] = dispatch::varlen_head_sizes();
        nb::list geometries;
        for (const auto& g : dispatch::gqa_decode_geometries()) geometries.append(nb::make_tuple(g[0], g[1], g[2]));
        out["gqa_decode_geometries"] = geometries;
        nb::list blocks;
        for (int b : kKernelBlockSizes) blocks.append(b);
        out["block_sizes"] = blocks;
        return out;
      },
      "Shapes the Metal kernels are instantiated for (from kernels_v2/kernel_constants.h).");

  m.def(
      "paged_params_layout",
      [] {
        using P = kernels::PagedAttentionParams;
        nb::list fields;
#define VLLM_METAL_FIELD(name) fields.append(nb::make_tuple(#name, offsetof(P, name)));
        VLLM_METAL_FIELD(num_seqs)
        VLLM_METAL_FIELD(num_heads)
        VLLM_METAL_FIELD(num_kv_heads)
        VLLM_METAL_FIELD(max_blocks_per_seq)
        VLLM_METAL_FIELD(partition_size)
        VLLM_METAL_FIELD(num_partitions)
        VLLM_METAL_FIELD(sliding_window)
        VLLM_METAL_FIELD(scale)
        VLLM_METAL_FIELD(softcap)
        VLLM_METAL_FIELD(use_key_ends)
#undef VLLM_METAL_FIELD
        return nb::make_tuple(fields, sizeof(P));
      },
      "((field, byte offset) list, size) of the host's PagedAttentionParams.");

  m.def(
      "force_paged_route",
      [](const std::optional<std::string>& route, int partition_size) {
        cpu::force_cpu_route(route ? std::optional<PagedRoute>(parse_route(*route)) : std::nullopt, partition_size);
      },
      "route"_a.none(), "partition_size"_a = kPartitionSize,
      "The CPU backend takes this route instead of deciding (None: decide again).");

  m.def(
      "check_threadgroup_size",
      [](const std::string& kernel, const std::array<uint32_t, 3>& threads, uint64_t max_total_threads) {
        dispatch::KernelLaunch launch{kernel, {1, 1, 1}, threads, {}};
        dispatch::check_threadgroup_size(launch, max_total_threads);
      },
      "kernel"_a, "threads"_a, "max_total_threads"_a,
      "eval_gpu's check of a launch's threads per threadgroup against its pipeline's maximum (raises RuntimeError).");

  m.def(
      "check_paged_metadata",
      [](const std::vector<int32_t>& cu_seqlens_q, const std::vector<int32_t>& seq_lens, int64_t total_q,
         int64_t capacity) {
        if (cu_seqlens_q.size() != seq_lens.size() + 1) {
          throw std::invalid_argument("cu_seqlens_q must have len(seq_lens) + 1 entries");
        }
        dispatch::check_paged_metadata(
            {cu_seqlens_q.data(), seq_lens.data(), static_cast<int>(seq_lens.size()), total_q, capacity});
      },
      "cu_seqlens_q"_a, "seq_lens"_a, "total_q"_a, "capacity"_a,
      "The metadata check both backends run (the CPU kernels at evaluation, the Metal route as the op is "
      "built); raises ValueError.");

  m.def("metal_library_name", &metal::library_name, "kind"_a, "text"_a,
        "The name MLX caches the Metal library under, for a 'metallib' path or JIT 'source' text.");
  m.def(
      "configured_metal_library", [] { return metal::configured_library().name; },
      "The cache name of the configured main Metal library (RuntimeError if none is configured).");
  m.def(
      "configured_metal_tensor_library",
      []() -> std::optional<std::string> {
        const auto library = metal::configured_tensor_library();
        return library ? std::optional<std::string>(library->name) : std::nullopt;
      },
      "The cache name of the configured tensor-op Metal library, or None.");

  m.def("time_cpu_paged_attention", &time_cpu_paged_attention, "query"_a, "key_cache"_a, "value_cache"_a,
        "block_tables"_a, "seq_lens"_a, "cu_seqlens_q"_a, "scale"_a, "rounds"_a = 1,
        "Run the CPU paged attention (fp32) once per layer's block table [layers, num_seqs, "
        "max_blocks], `rounds` times; returns (seconds per call, last route).");
}

}  // namespace vllm_metal
