// Python bindings of the expert-matmul op's Metal launch plan (debug submodule:
// tests run the plan on the MSL harness). Called from bindings.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace vllm_metal {

void bind_experts_debug(nanobind::module_& debug);

}  // namespace vllm_metal
