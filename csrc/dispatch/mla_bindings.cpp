#include "dispatch/mla_bindings.h"

#include <nanobind/stl/string.h>

#include <cstddef>
#include <string>

#include "dispatch/launch_dict.h"
#include "dispatch/mla_launch_plan.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vllm_metal {

namespace {

nb::dict plan_dict(const dispatch::MlaPlan& plan) {
  nb::dict out = launch_dict(plan.launch);
  out["params"] = nb::bytes(reinterpret_cast<const char*>(&plan.params), sizeof(plan.params));
  return out;
}

}  // namespace

void bind_mla_debug(nb::module_& m) {
  m.def(
      "mla_launch_plan",
      [](const std::string& op, const std::string& dtype, int total_q, int num_seqs, int num_heads, int rank,
         int rope_dim, int block_size, int num_blocks, int max_blocks_per_seq, float scale) {
        dispatch::MlaProblem p;
        p.dtype = dispatch::parse_dtype(dtype);
        p.total_q = total_q;
        p.num_seqs = num_seqs;
        p.num_heads = num_heads;
        p.rank = rank;
        p.rope_dim = rope_dim;
        p.block_size = block_size;
        p.num_blocks = num_blocks;
        p.max_blocks_per_seq = max_blocks_per_seq;
        p.scale = scale;
        if (op == "latent_cache_write") return plan_dict(dispatch::plan_latent_cache_write(p));
        if (op == "mla_attention") return plan_dict(dispatch::plan_mla_attention(p));
        throw std::invalid_argument("op must be 'latent_cache_write' or 'mla_attention'");
      },
      "op"_a, "dtype"_a, "total_q"_a, nb::kw_only(), "num_seqs"_a = 0, "num_heads"_a = 0, "rank"_a,
      "rope_dim"_a, "block_size"_a, "num_blocks"_a, "max_blocks_per_seq"_a = 0, "scale"_a = 1.0f,
      "The Metal launch of an MLA op (dict: kernel, grid, threads, params bytes).");

  m.def(
      "mla_params_layout",
      [] {
        using P = kernels::MlaParams;
        nb::list fields;
#define VLLM_METAL_FIELD(name) fields.append(nb::make_tuple(#name, offsetof(P, name)));
        VLLM_METAL_FIELD(total_q)
        VLLM_METAL_FIELD(num_seqs)
        VLLM_METAL_FIELD(num_heads)
        VLLM_METAL_FIELD(rank)
        VLLM_METAL_FIELD(rope_dim)
        VLLM_METAL_FIELD(block_size)
        VLLM_METAL_FIELD(num_blocks)
        VLLM_METAL_FIELD(max_blocks_per_seq)
        VLLM_METAL_FIELD(scale)
#undef VLLM_METAL_FIELD
        return nb::make_tuple(fields, sizeof(P));
      },
      "((field, byte offset) list, size) of the host's MlaParams.");
}

}  // namespace vllm_metal
