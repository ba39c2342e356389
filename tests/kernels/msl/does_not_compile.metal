// A kernel the harness must refuse with the compiler's message (an undeclared name).
#include <metal_stdlib>
using namespace metal;

kernel void broken(device float* out [[buffer(0)]], uint tid [[thread_position_in_grid]]) {
  out[tid] = undeclared_value;
}
