// Python bindings of the MLA ops' Metal launch plans (debug submodule: tests run
// them on the MSL harness). Called from bindings.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace vllm_metal {

void bind_mla_debug(nanobind::module_& debug);

}  // namespace vllm_metal
