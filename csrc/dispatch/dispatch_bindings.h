// Python bindings of the dispatch layer: diagnostics, the decision function and
// the Metal launch plans (tests run the plans on the MSL harness), kernel
// library configuration. Called from bindings.cpp's NB_MODULE.
#pragma once

#include <nanobind/nanobind.h>

namespace vllm_metal {

void bind_dispatch(nanobind::module_& m);

}  // namespace vllm_metal
