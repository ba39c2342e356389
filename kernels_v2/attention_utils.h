// Helpers shared by the paged-attention kernels: online softmax in log2 space,
// element loads, the sequence search.
#pragma once

#include <metal_stdlib>
#include <metal_simdgroup>

#include "kernel_constants.h"
#include "kv_quant.h"
#include "paged_attention_params.h"

using namespace metal;

#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif

// Function constants: runtime features specialized at pipeline creation.
constant bool use_sliding_window [[function_constant(VLLM_METAL_FC_SLIDING_WINDOW)]];
constant bool use_softcap [[function_constant(VLLM_METAL_FC_SOFTCAP)]];
constant bool use_sinks [[function_constant(VLLM_METAL_FC_SINKS)]];
constant bool write_partials [[function_constant(VLLM_METAL_FC_WRITE_PARTIALS)]];

// Running max before any key: finite, so exp2(m - m_new) stays exact (0) even
// when the compiler assumes no infinities (fast math).
constant constexpr float kEmptyMax = -1.0e30f;

// Scale folded into q: scores come out in log2 units (one exp2 per key), except
// under soft-capping, where tanh needs natural units and the score is rescaled after.
METAL_FUNC float query_scale(constant PagedAttentionParams& params) {
  return use_softcap ? params.scale : params.scale * M_LOG2E_F;
}

// Score -> log2 units for the online softmax (soft-cap applied in natural units).
METAL_FUNC float finish_score(float s, constant PagedAttentionParams& params) {
  return use_softcap ? params.softcap * precise::tanh(s / params.softcap) * M_LOG2E_F : s;
}

METAL_FUNC float4 finish_scores(float4 s, constant PagedAttentionParams& params) {
  return use_softcap ? params.softcap * precise::tanh(s / params.softcap) * M_LOG2E_F : s;
}

// The sequence that owns query row `row`: the last s with cu_seqlens_q[s] <= row
// (sequences with no rows share their start with the next one).
METAL_FUNC int find_sequence(device const int* cu_seqlens_q, int num_seqs, int row) {
  int lo = 0, hi = num_seqs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu_seqlens_q[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Softmax state of a set of keys, log2 domain: max m, sum l of 2^(s - m).
// With sinks the sink logit joins the denominator; returns the factor that
// turns the accumulated sum into the output (0 when nothing was attended).
METAL_FUNC float output_factor(float m, float l, int head, device const float* sinks) {
  if (use_sinks) {
    const float sink = sinks[head] * M_LOG2E_F;
    const float m_all = max(m, sink);
    const float carry = exp2(m - m_all);
    l = l * carry + exp2(sink - m_all);
    return l > 0.0f ? carry / l : 0.0f;
  }
  return l > 0.0f ? 1.0f / l : 0.0f;
}

// dst[0:N] = float(src[0:N]); N a multiple of 4, src 4-element aligned.
template <typename T, int N>
METAL_FUNC void load_floats(device const T* src, thread float* dst) {
  for (int i = 0; i < N; i += 4) {
    const float4 v = float4(*reinterpret_cast<device const vec<T, 4>*>(src + i));
    dst[i] = v.x;
    dst[i + 1] = v.y;
    dst[i + 2] = v.z;
    dst[i + 3] = v.w;
  }
}

template <typename T, int N>
METAL_FUNC void store_floats(thread const float* src, float factor, device T* dst) {
  for (int i = 0; i < N; i += 4) {
    *reinterpret_cast<device vec<T, 4>*>(dst + i) =
        vec<T, 4>(float4(src[i], src[i + 1], src[i + 2], src[i + 3]) * factor);
  }
}
