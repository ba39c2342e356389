// Prelude of every translated .metal file: MSL as C++17 for the CPU harness.
//
// Standard headers come first: the address-space keywords below are empty
// macros, and `thread` would break <thread>.
#pragma once

#include "msl_simd.h"
#include "msl_tensor_ops.h"
#include "msl_types.h"

namespace metal {
using ::half;
}

namespace msl_hx {

// Set the function constants the launch provides, then run the grid. A
// constant the launch leaves out reads as 0 with is_function_constant_defined
// false (Metal would refuse to build a pipeline that uses it).
inline int run_entry(msl_hx_launch* launch, void (*body)(), msl_hx_function_constant* constants, int num_constants) {
  for (int i = 0; i < num_constants; ++i) {
    const msl_hx_function_constant& fc = constants[i];
    fc.set(0.0);
    *fc.defined = false;
    for (int j = 0; j < launch->num_constants; ++j) {
      if (launch->constants[j].index == fc.index) {
        fc.set(launch->constants[j].value);
        *fc.defined = true;
      }
    }
  }
  return run_launch(launch, body);
}

}  // namespace msl_hx

#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#define METAL_FUNC inline
