// Kernels that probe the MSL harness itself: collectives with known answers,
// and one planted bug per check the harness promises (tests/kernels/test_harness.py).
#include <metal_stdlib>
using namespace metal;

constant bool doubled [[function_constant(0)]];

// out[tid * 12 + k]: twelve collectives of lane values x[tid].
kernel void collectives(
    device const float* x [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint tid [[thread_position_in_grid]],
    uint lane [[thread_index_in_simdgroup]]) {
  const float v = x[tid];
  device float* o = out + tid * 12;
  o[0] = simd_shuffle(v, (lane * 7) % 32);
  o[1] = simd_shuffle_xor(v, 5);
  o[2] = simd_shuffle_down(v, 3);
  o[3] = simd_shuffle_up(v, 2);
  o[4] = simd_broadcast(v, 9);
  o[5] = simd_sum(v);
  o[6] = simd_max(v);
  o[7] = simd_min(v);
  o[8] = simd_prefix_exclusive_sum(v);
  o[9] = simd_prefix_inclusive_sum(v);
  o[10] = float(uint64_t(simd_ballot(v > 0.0f)) & 0xffffffffu);
  o[11] = simd_shuffle_rotate_down(v, 4);
}

kernel void vector_sum(
    device const float4* x [[buffer(0)]],
    device float4* out [[buffer(1)]],
    uint tid [[thread_position_in_grid]]) {
  out[tid] = simd_sum(x[tid]);
}

// Threadgroup exchange done right: every slot is written before the barrier
// (the size is an expression, as in real kernels).
kernel void threadgroup_reverse(
    device const float* x [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint tid [[thread_position_in_grid]],
    uint local [[thread_index_in_threadgroup]]) {
  threadgroup float buf[2 * 32];
  buf[local] = x[tid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = (doubled ? 2.0f : 1.0f) * buf[63 - local];
}

// Bug: reads a neighbour's slot without a barrier (result depends on lane order).
kernel void missing_barrier(
    device const float* x [[buffer(0)]],
    device float* out [[buffer(1)]],
    uint tid [[thread_position_in_grid]],
    uint local [[thread_index_in_threadgroup]]) {
  threadgroup float buf[64];
  buf[local] = x[tid];
  out[tid] = buf[(local + 1) % 64];
}

// Bug: only half the slots are written, all are read (poison shows as NaN).
kernel void unwritten_threadgroup_memory(
    device float* out [[buffer(0)]],
    uint tid [[thread_position_in_grid]],
    uint local [[thread_index_in_threadgroup]]) {
  threadgroup float buf[64];
  if (local < 32) buf[local] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = buf[63 - local];
}

// Bug: a collective inside a lane-dependent branch.
kernel void divergent_sum(device float* out [[buffer(0)]], uint tid [[thread_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]]) {
  float v = 1.0f;
  if (lane < 16) v = simd_sum(v);
  out[tid] = v;
}

// Bug: lanes past n return before a barrier the others reach.
kernel void early_return(device float* out [[buffer(0)]], constant uint& n [[buffer(1)]],
                         uint tid [[thread_position_in_grid]], uint local [[thread_index_in_threadgroup]]) {
  threadgroup float buf[64];
  if (tid >= n) return;
  buf[local] = 1.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = buf[local];
}

// Bug: an off-by-one write past the end of `out`.
kernel void off_by_one(device float* out [[buffer(0)]], constant uint& n [[buffer(1)]],
                       uint tid [[thread_position_in_grid]]) {
  if (tid <= n) out[tid] = 1.0f;
}

// Bug: a shuffle from a lane that is not active in the collective.
kernel void inactive_shuffle(device float* out [[buffer(0)]], uint tid [[thread_position_in_grid]],
                             uint lane [[thread_index_in_simdgroup]]) {
  float v = float(lane);
  if (lane < 8) v = simd_shuffle(v, 20);
  out[tid] = v;
}

kernel void function_constant_probe(device float* out [[buffer(0)]], uint tid [[thread_position_in_grid]]) {
  out[tid] = is_function_constant_defined(doubled) ? (doubled ? 2.0f : 1.0f) : -1.0f;
}
