// Python bindings of the dispatch layer. bind_dispatch: what production reads
// (kernels stamp, Metal head sizes, GPU cores, kernel library configuration);
// bind_dispatch_debug: diagnostics, the decision functions and the Metal launch
// plans (tests run the plans on the MSL harness). Called from bindings.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace vllm_metal {

void bind_dispatch(nanobind::module_& m);
void bind_dispatch_debug(nanobind::module_& debug);

}  // namespace vllm_metal
