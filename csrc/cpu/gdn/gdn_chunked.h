// The chunked (WY) form of the gated delta rule, for a request's rows with
// scalar gates: the token recurrence of gdn_cpu.h regrouped into matrix
// products over chunks of C rows, so the state is read and written once per
// chunk instead of twice per token.
//
// One chunk of n <= C rows (t, i = 0 .. n - 1) from state S0 [Dv, Dk], gates
// g_t, with r(t, i) = prod_{i < s <= t} g_s for i <= t (r(t, t) = 1) and
// gamma_t = prod_{s <= t} g_s. Unrolling the recurrence gives
//   S_t = gamma_t S0 + sum_{i <= t} r(t, i) d_i k_i^T
// where d_t ([Dv]) is the update token t adds. With the delta rule
//   d_t = beta_t (v_t - gamma_t S0 k_t - sum_{i < t} r(t, i) (k_i . k_t) d_i),
// that is (I + A) D = diag(beta) (V - diag(gamma) K S0^T) with A strictly lower,
// A[t, i] = beta_t r(t, i) (k_t . k_i), solved as D = T U, T = (I + A)^-1;
// without it (Mamba2) d_t = beta_t v_t. Then
//   y_t = gamma_t S0 q_t + sum_{i <= t} r(t, i) (k_i . q_t) d_i
//   S_n = gamma_{n-1} S0 + sum_i r(n - 1, i) d_i k_i^T
// The ratios are products over (i, t] in double, never gamma_t / gamma_i:
// gates of exactly 0, or small enough to underflow, give zeros and no NaN.
//
// The big products (S0 [K; Q]^T, the state update, U T^T) are register-tiled
// GEMMs, SIMD over a row of the output; the C x C matrices (A, T, the ratios)
// are worked in double. Rounding differs from the recurrence's, and depends on
// where the chunks start (the first row of each request in the step).
#pragma once

#include "cpu/gdn/gdn_cpu.h"
#include "cpu/runtime/isa.h"
#include "cpu/runtime/scratch.h"

namespace vllm_metal::cpu {

// Per-thread buffers of one (request, head) item, grown as needed.
struct ChunkScratch {
  ScratchVector<float> f;
  ScratchVector<double> d;
};

struct GdnChunkKernels {
  // Rows [r0, r1) for value head h, in chunks of a.chunk rows from r0 (the last
  // shorter), from and into the head's [Dv, Dk] state. a.chunk is one of
  // kGdnChunkSizes and the gate scalar.
  void (*rows)(const GatedDeltaArgs& a, int h, int64_t r0, int64_t r1, float* state,
               ChunkScratch& w);
};

const GdnChunkKernels& gdn_chunk_kernels_generic();
#if VLLM_METAL_X86_DISPATCH
const GdnChunkKernels& gdn_chunk_kernels_avx2();
const GdnChunkKernels& gdn_chunk_kernels_avx512();
#endif

// The table of the active ISA (cpu/runtime/isa.h).
const GdnChunkKernels& gdn_chunk_kernels();

} // namespace vllm_metal::cpu
