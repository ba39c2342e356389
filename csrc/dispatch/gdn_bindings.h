// Python bindings of the Gated DeltaNet ops' Metal launch plans (debug submodule:
// tests run them on the MSL harness). Called from bindings.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace vllm_metal {

void bind_gdn_debug(nanobind::module_& debug);

}  // namespace vllm_metal
