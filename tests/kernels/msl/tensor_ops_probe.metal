// Kernels that probe the harness's emulation of Metal 4's tensor ops
// (tools/msl_harness/include/msl_tensor_ops.h): a tiled product written through
// the documented accessors, and one planted misuse per check the emulation
// promises (tests/kernels/test_tensor_ops.py).
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;

using View = tensor<device const half, dextents<int32_t, 2>, tensor_inline>;
using Out = tensor<device float, dextents<int32_t, 2>, tensor_inline>;

// c [16, 32] = a [16, k] b[32, k]^T (+ c when accumulate): a simdgroup per
// tile, one tile per threadgroup; k a multiple of 32, taken in chunks of 32.
// `scatter`: the destination written slot by slot through its indices (else
// store()).
kernel void tile_product(
    device const half* a [[buffer(0)]],
    device const half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant int& k [[buffer(3)]],
    constant int& flags [[buffer(4)]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr auto desc = matmul2d_descriptor(16, 32, 32, false, true, true,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  auto acc = op.get_destination_cooperative_tensor<View, View, float>();
  const bool accumulate = (flags & 1) != 0;
  const bool scatter = (flags & 2) != 0;
  for (int i = 0; i < acc.get_capacity(); ++i) {
    if (!acc.is_valid_element(i)) continue;
    const auto idx = acc.get_multidimensional_index(i);
    acc[i] = accumulate ? c[idx[1] * 32 + idx[0]] : 0.0f;
  }
  for (int k0 = 0; k0 < k; k0 += 32) {
    View left(a + k0, dextents<int32_t, 2>(32, 16), array<int, 2>({1, k}));
    View right(b + k0, dextents<int32_t, 2>(32, 32), array<int, 2>({1, k}));
    op.run(left, right, acc);
  }
  if (scatter) {
    for (int i = 0; i < acc.get_capacity(); ++i) {
      if (!acc.is_valid_element(i)) continue;
      const auto idx = acc.get_multidimensional_index(i);
      c[idx[1] * 32 + idx[0]] = acc[i];
    }
  } else {
    acc.store(Out(c, dextents<int32_t, 2>(32, 16)));
  }
}

// Misuses: 1 assumes a layout (slot i of lane l is row l / 2, column
// (l % 2) * 16 + i); 2 accumulates into storage never set; 3 only half the
// lanes enter run; 4 a left view of 8 rows for a 16-row tile.
kernel void misuse(
    device const half* a [[buffer(0)]],
    device const half* b [[buffer(1)]],
    device float* c [[buffer(2)]],
    constant int& which [[buffer(3)]],
    uint lane [[thread_index_in_simdgroup]]) {
  constexpr auto desc = matmul2d_descriptor(16, 32, 32, false, true, false,
                                            matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  auto acc = op.get_destination_cooperative_tensor<View, View, float>();
  if (which != 2) {
    for (int i = 0; i < acc.get_capacity(); ++i) acc[i] = 0.0f;
  }
  View left(a, dextents<int32_t, 2>(32, which == 4 ? 8 : 16), array<int, 2>({1, 32}));
  View right(b, dextents<int32_t, 2>(32, 32), array<int, 2>({1, 32}));
  if (which != 3 || lane < 16) op.run(left, right, acc);
  if (which == 1) {
    for (int i = 0; i < 16; ++i) c[(lane / 2) * 32 + (lane % 2) * 16 + i] = acc[i];
  } else {
    acc.store(Out(c, dextents<int32_t, 2>(32, 16)));
  }
}
