// Gated DeltaNet (linear attention) over a packed batch whose per-request
// states live in KV cache pages (vllm_metal/attention/caches/state_pages.py
// places them): the short causal conv and the gated delta rule.
//
// Request n owns rows [cu_seqlens[n], cu_seqlens[n + 1]) and block slots[n] of
// the pages, seen as float32 rows lo / hi [num_blocks, width]. It continues
// from the state in its block, or from zeros when has_state[n] is 0 (whatever
// the block holds is then never read). Afterwards the block holds its new
// state; nothing else of the pages is written.
//
// short_conv, per channel c, with z = [state (K - 1 rows); the request's rows of x]:
//   y[t, c] = sum_j weight[c, j] * z[t + j, c]      (no activation)
//   state   = the last K - 1 rows of z, [K - 1, C] at lo[slot, conv_offset:]
// gated_delta, per value head h (key head h / (Hv / Hk)), S its [Dv, Dk] state:
//   S = S * g                    (g scalar per head, or per key column)
//   S = S + outer(beta * (v - S k), k)
//   y = S q
// and without the delta rule (Mamba2's SSD mixers: gated linear attention, the
// state only accumulates, nothing is subtracted):
//   S = S * g
//   S = S + beta * outer(v, k)
//   y = S q
// With scalar gates and a chunk size, the same maths in its chunked form
// (gdn_chunked.h): equal up to rounding, faster over a prompt's rows.
// Everything is computed in float32.
#pragma once

#include <cstdint>

#include "cpu/linear/linear_cpu.h"

namespace vllm_metal::cpu {

struct GdnBatch {
  const int32_t* slots;       // [N]: distinct block ids
  const int32_t* cu_seqlens;  // [N + 1]
  const int32_t* has_state;   // [N]: 0 starts from zeros
  int num_seqs;               // N
  int64_t total_rows;         // T
  int64_t num_blocks;
};

// Throws std::invalid_argument (cu_seqlens not from 0 up to T, a slot named
// twice) or std::out_of_range (a slot outside [0, num_blocks)), prefixed by op.
void check_gdn_batch(const char* op, const GdnBatch& b);

struct ShortConvArgs {
  const void* x;        // [T, C]
  Elem x_type;
  const void* weight;   // [C, K]
  Elem weight_type;
  int channels;         // C
  int kernel;           // K
  float* lo;            // [num_blocks, lo_width]: state at lo[slot, conv_offset:]
  int64_t lo_width;
  int64_t conv_offset;
  void* y;              // [T, C]
  Elem y_type;
  GdnBatch batch;
};

// Checks the batch before writing anything.
void short_conv_cpu(const ShortConvArgs& a);

struct GatedDeltaArgs {
  const void* q;        // [T, Hk, Dk]
  Elem q_type;
  const void* k;        // [T, Hk, Dk]
  Elem k_type;
  const void* v;        // [T, Hv, Dv]
  Elem v_type;
  const void* g;        // [T, Hv] or, with vector_gate, [T, Hv, Dk]
  Elem g_type;
  bool vector_gate;
  const void* beta;     // [T, Hv]
  Elem beta_type;
  int num_k_heads;      // Hk
  int num_v_heads;      // Hv, a multiple of Hk
  int head_k_dim;       // Dk
  int head_v_dim;       // Dv
  float* lo;            // [num_blocks, lo_width]: heads h < heads_in_lo at ssm_offset + h * Dv * Dk
  int64_t lo_width;
  float* hi;            // [num_blocks, hi_width]: the others at (h - heads_in_lo) * Dv * Dk
  int64_t hi_width;
  int64_t ssm_offset;
  int heads_in_lo;
  bool delta_rule;      // false: S += beta * outer(v, k), no S k term
  int chunk;            // 0: token by token; else one of kGdnChunkSizes (scalar gates only)
                        // in chunks from each request's first row, a last chunk under
                        // kGdnChunkMinRows rows token by token
  void* y;              // [T, Hv, Dv]
  Elem y_type;
  GdnBatch batch;
};

// Checks the batch before writing anything.
void gated_delta_cpu(const GatedDeltaArgs& a);

// Rows per chunk of the chunked form (GatedDeltaArgs::chunk).
inline constexpr int kGdnChunkSizes[] = {32, 64};

// A request's last chunk with fewer rows than this (a decode row, a prompt's
// tail) goes token by token: the chunked form's products cost about as much
// for one row as for sixteen, which is more than 8 token steps.
inline constexpr int kGdnChunkMinRows = 8;

inline bool gdn_chunk_supported(int chunk) {
  for (int c : kGdnChunkSizes) {
    if (c == chunk) return true;
  }
  return false;
}

// Head h's [Dv, Dk] state inside block `slot` of the pages.
inline float* gdn_head_state(const GatedDeltaArgs& a, int64_t slot, int h) {
  const int64_t per = static_cast<int64_t>(a.head_v_dim) * a.head_k_dim;
  if (h < a.heads_in_lo) return a.lo + slot * a.lo_width + a.ssm_offset + h * per;
  return a.hi + slot * a.hi_width + (h - a.heads_in_lo) * per;
}

} // namespace vllm_metal::cpu
