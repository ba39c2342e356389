#include "dispatch/experts_bindings.h"

#include <nanobind/stl/string.h>

#include <cstddef>
#include <string>

#include "dispatch/experts_launch_plan.h"
#include "dispatch/launch_dict.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vllm_metal {

void bind_experts_debug(nb::module_& m) {
  m.def(
      "experts_launch_plan",
      [](const std::string& dtype, int bits, int rows, int pairs, int in_features, int out_features,
         int experts, int group_size, bool has_bias, bool mxfp4) {
        dispatch::ExpertProblem p;
        p.dtype = dispatch::parse_dtype(dtype);
        p.bits = bits;
        p.rows = rows;
        p.pairs = pairs;
        p.in_features = in_features;
        p.out_features = out_features;
        p.experts = experts;
        p.group_size = group_size;
        p.has_bias = has_bias;
        p.mxfp4 = mxfp4;
        const auto plan = dispatch::plan_experts(p);
        nb::dict out = launch_dict(plan.launch);
        out["params"] = nb::bytes(reinterpret_cast<const char*>(&plan.params), sizeof(plan.params));
        return out;
      },
      "dtype"_a, "bits"_a, "rows"_a, "pairs"_a, "in_features"_a, "out_features"_a, "experts"_a,
      nb::kw_only(), "group_size"_a = 0, "has_bias"_a = false, "mxfp4"_a = false,
      "The Metal launch of the expert-matmul op (dict: kernel, grid, threads, params bytes).");

  m.def(
      "experts_params_layout",
      [] {
        using P = kernels::ExpertParams;
        nb::list fields;
#define VLLM_METAL_FIELD(name) fields.append(nb::make_tuple(#name, offsetof(P, name)));
        VLLM_METAL_FIELD(rows)
        VLLM_METAL_FIELD(pairs)
        VLLM_METAL_FIELD(pairs_per_row)
        VLLM_METAL_FIELD(in_features)
        VLLM_METAL_FIELD(out_features)
        VLLM_METAL_FIELD(experts)
        VLLM_METAL_FIELD(group_size)
        VLLM_METAL_FIELD(has_bias)
#undef VLLM_METAL_FIELD
        return nb::make_tuple(fields, sizeof(P));
      },
      "((field, byte offset) list, size) of the host's ExpertParams.");
}

}  // namespace vllm_metal
