#include "dispatch/lora_bindings.h"

#include <nanobind/stl/string.h>

#include <cstddef>
#include <string>

#include "dispatch/launch_dict.h"
#include "dispatch/lora_launch_plan.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace vllm_metal {

void bind_lora_debug(nb::module_& m) {
  m.def(
      "lora_launch_plan",
      [](const std::string& dtype, int rows, int in_features, int out_features, int rank, int num_slots, bool add,
         int out_cols, int column_offset, bool in_place) {
        dispatch::LoraProblem p;
        p.dtype = dispatch::parse_dtype(dtype);
        p.rows = rows;
        p.in_features = in_features;
        p.out_features = out_features;
        p.rank = rank;
        p.num_slots = num_slots;
        p.add = add;
        p.out_cols = add ? out_cols : out_features;
        p.column_offset = column_offset;
        p.in_place = in_place;
        const auto plan = dispatch::plan_lora(p);
        nb::dict out;
        out["launches"] = nb::make_tuple(launch_dict(plan.shrink), launch_dict(plan.expand));
        out["params"] = nb::bytes(reinterpret_cast<const char*>(&plan.params), sizeof(plan.params));
        out["u_floats"] = plan.u_floats;
        return out;
      },
      "dtype"_a, "rows"_a, "in_features"_a, "out_features"_a, "rank"_a, "num_slots"_a, nb::kw_only(),
      "add"_a = false, "out_cols"_a = 0, "column_offset"_a = 0, "in_place"_a = false,
      "The Metal launches of the LoRA op (dict: launches (shrink, expand), params bytes, u_floats).");

  m.def(
      "lora_params_layout",
      [] {
        using P = kernels::LoraParams;
        nb::list fields;
#define VLLM_METAL_FIELD(name) fields.append(nb::make_tuple(#name, offsetof(P, name)));
        VLLM_METAL_FIELD(rows)
        VLLM_METAL_FIELD(in_features)
        VLLM_METAL_FIELD(out_features)
        VLLM_METAL_FIELD(rank)
        VLLM_METAL_FIELD(num_slots)
        VLLM_METAL_FIELD(out_cols)
        VLLM_METAL_FIELD(column_offset)
        VLLM_METAL_FIELD(first_column)
        VLLM_METAL_FIELD(launch_columns)
#undef VLLM_METAL_FIELD
        return nb::make_tuple(fields, sizeof(P));
      },
      "((field, byte offset) list, size) of the host's LoraParams.");
}

}  // namespace vllm_metal
