#include "dispatch/gdn_bindings.h"

#include <nanobind/stl/string.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "dispatch/gdn_launch_plan.h"
#include "dispatch/launch_dict.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vllm_metal {

namespace {

nb::dict plan_dict(const dispatch::GdnPlan& plan) {
  nb::list launches;
  for (const auto& l : plan.launches) launches.append(launch_dict(l));
  nb::dict out;
  out["launches"] = launches;
  out["params"] = nb::bytes(reinterpret_cast<const char*>(&plan.params), sizeof(plan.params));
  return out;
}

}  // namespace

void bind_gdn_debug(nb::module_& m) {
  m.def(
      "gdn_launch_plan",
      [](const std::string& op, const std::string& dtype, int total_rows, int num_seqs, int num_blocks,
         int lo_width, int hi_width, int channels, int taps, int conv_offset, int num_k_heads, int num_v_heads,
         int head_k_dim, int head_v_dim, int ssm_offset, int heads_in_lo, bool vector_gate,
         bool delta_rule, int chunk) {
        dispatch::GdnProblem p;
        p.dtype = dispatch::parse_dtype(dtype);
        p.total_rows = total_rows;
        p.num_seqs = num_seqs;
        p.num_blocks = num_blocks;
        p.lo_width = lo_width;
        p.hi_width = hi_width;
        p.channels = channels;
        p.taps = taps;
        p.conv_offset = conv_offset;
        p.num_k_heads = num_k_heads;
        p.num_v_heads = num_v_heads;
        p.head_k_dim = head_k_dim;
        p.head_v_dim = head_v_dim;
        p.ssm_offset = ssm_offset;
        p.heads_in_lo = heads_in_lo;
        p.vector_gate = vector_gate;
        p.delta_rule = delta_rule;
        p.chunk = chunk;
        if (op == "short_conv") return plan_dict(dispatch::plan_gdn_short_conv(p));
        if (op == "gated_delta") return plan_dict(dispatch::plan_gdn_gated_delta(p));
        throw std::invalid_argument("op must be 'short_conv' or 'gated_delta'");
      },
      "op"_a, "dtype"_a, "total_rows"_a, nb::kw_only(), "num_seqs"_a, "num_blocks"_a, "lo_width"_a,
      "hi_width"_a = 0, "channels"_a = 0, "taps"_a = 0, "conv_offset"_a = 0, "num_k_heads"_a = 0,
      "num_v_heads"_a = 0,
      "head_k_dim"_a = 0, "head_v_dim"_a = 0, "ssm_offset"_a = 0, "heads_in_lo"_a = 0,
      "vector_gate"_a = false, "delta_rule"_a = true, "chunk"_a = 0,
      "The Metal launches of a GDN op (dict: launches [kernel, grid, threads], in order; params bytes).");

  m.def(
      "gdn_params_layout",
      [] {
        using P = kernels::GdnParams;
        nb::list fields;
#define VLLM_METAL_FIELD(name) fields.append(nb::make_tuple(#name, offsetof(P, name)));
        VLLM_METAL_FIELD(total_rows)
        VLLM_METAL_FIELD(num_seqs)
        VLLM_METAL_FIELD(num_blocks)
        VLLM_METAL_FIELD(lo_width)
        VLLM_METAL_FIELD(hi_width)
        VLLM_METAL_FIELD(channels)
        VLLM_METAL_FIELD(taps)
        VLLM_METAL_FIELD(conv_offset)
        VLLM_METAL_FIELD(num_k_heads)
        VLLM_METAL_FIELD(num_v_heads)
        VLLM_METAL_FIELD(head_k_dim)
        VLLM_METAL_FIELD(head_v_dim)
        VLLM_METAL_FIELD(ssm_offset)
        VLLM_METAL_FIELD(heads_in_lo)
        VLLM_METAL_FIELD(vector_gate)
        VLLM_METAL_FIELD(delta_rule)
        VLLM_METAL_FIELD(chunk)
#undef VLLM_METAL_FIELD
        return nb::make_tuple(fields, sizeof(P));
      },
      "((field, byte offset) list, size) of the host's GdnParams.");
}

}  // namespace vllm_metal
