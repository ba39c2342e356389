// A planned launch as the debug bindings hand it to Python (tests run it on the
// MSL harness): {"kernel", "grid", "threads", "library"} ("main" or "tensor_ops").
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "dispatch/metal_launch_plan.h"

namespace vllm_metal {

inline nanobind::dict launch_dict(const dispatch::KernelLaunch& l) {
  nanobind::dict out;
  out["kernel"] = l.kernel;
  out["grid"] = nanobind::make_tuple(l.grid[0], l.grid[1], l.grid[2]);
  out["threads"] = nanobind::make_tuple(l.threads[0], l.threads[1], l.threads[2]);
  out["library"] = l.tensor_ops ? "tensor_ops" : "main";
  return out;
}

}  // namespace vllm_metal
