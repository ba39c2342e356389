// Python bindings of the vllm-metal extension (imported only via
// vllm_metal.metal.get_ops()).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include "constants.h"
#include "debug.h"
#include "ops/paged_attention.h"
#include "ops/reshape_and_cache.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "vllm-metal native ops: paged KV-cache write and paged attention as MLX primitives";

  m.attr("PARTITION_SIZE") = vllm_metal::kPartitionSize;
  nb::list block_sizes;
  for (int b : vllm_metal::kKernelBlockSizes) block_sizes.append(b);
  m.attr("KERNEL_BLOCK_SIZES") = nb::steal(PySequence_Tuple(block_sizes.ptr()));
  m.attr("mlx_build_version") = vllm_metal::kMlxBuildVersion;

  m.def(
      "reshape_and_cache",
      &vllm_metal::reshape_and_cache,
      "key"_a,
      "value"_a,
      "key_cache"_a,
      "value_cache"_a,
      "slot_mapping"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Write K/V rows [num_tokens, num_kv_heads, head_size] into paged caches
[num_blocks, block_size, num_kv_heads, head_size] at slot_mapping [num_tokens]
(negative = skip). Returns (key_cache, value_cache); they share the input
caches' buffers, so the write is in place.)");

  m.def(
      "paged_attention",
      &vllm_metal::paged_attention,
      "query"_a,
      "key_cache"_a,
      "value_cache"_a,
      "block_tables"_a,
      "seq_lens"_a,
      "cu_seqlens_q"_a,
      "scale"_a,
      "sliding_window"_a = nb::none(),
      "softcap"_a = nb::none(),
      "sinks"_a = nb::none(),
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Varlen causal attention through block tables. query [total_q, num_heads,
head_size]; caches [num_blocks, block_size, num_kv_heads, head_size];
block_tables int32 [num_seqs, max_blocks]; seq_lens int32 [num_seqs];
cu_seqlens_q int32 [num_seqs + 1]; sinks float [num_heads] or None.
Returns [total_q, num_heads, head_size] in query's dtype.)");

  m.def("_data_ptr", &vllm_metal::data_ptr, "array"_a,
        "Address of an evaluated array's first element (tests).");
  m.def("cpu_isa", &vllm_metal::cpu_isa,
        "Instruction set the CPU kernels use: 'avx512', 'avx2' or 'generic'.");
  m.def("_set_cpu_isa", &vllm_metal::set_cpu_isa, "name"_a,
        "Use a narrower instruction set than detected (tests).");
  m.def("cpu_threads", &vllm_metal::cpu_threads,
        "Threads of the CPU kernel pool (VLLM_METAL_CPU_THREADS; 0 = all).");
}
