// One token per row of logits: argmax, or a draw from softmax(logits / T).
//
// MLX's CPU backend composes Gumbel-max sampling from ~10 scalar nodes that
// draw V uniforms and take 2V logs per row (0.6 ms for a 49k vocab, 10 ms for
// 16 rows). A categorical draw needs one uniform: the inverse of the CDF. So
// each row here is three vectorized passes over the vocab: max, weights
// exp((x - max) / T) with per-block sums, and a scan of the one block the
// uniform lands in. min_p, top-k and top-p become one floor on the weights
// (cpu/sampling/sample_filters.h), applied before the draw.
#pragma once

#include <cstdint>

namespace vllm_metal::cpu {

// The uniform in [0, 1) a row draws from its key (uint32 [2], key[0] the high
// half): splitmix64 of the 64-bit key, top 53 bits. Exposed for the tests'
// reference.
double key_uniform(uint32_t high, uint32_t low);

// Per-row filters, in vLLM's order (each null when no row uses it):
//   allowed uint32 [rows, allowed_ld]: a grammar's bitmask, bit c % 32 of word
//          c / 32 admitting token c; the others count as -inf logits
//   min_p  float32 [rows]: drop tokens below min_p x the largest probability (<= 0: off)
//   top_k  int32 [rows]: keep the k largest, ties at the k-th kept (<= 0 or >= vocab: off)
//   top_p  float32 [rows]: then keep the fewest largest holding top_p of the
//          remaining mass, ties kept (>= 1: off)
struct SampleFilters {
  const uint32_t* allowed = nullptr;
  int64_t allowed_ld = 0;
  const float* min_p = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
};

// logits float32 [rows, vocab] (row-contiguous), temperature float32 [rows],
// keys uint32 [rows, 2] -> out int32 [rows].
//   temperature[r] > 0: the smallest i whose cumulative weight exceeds
//     u * total, weights exp((x_i - max) / T) (0 for -inf logits and for tokens
//     the filters drop), u from keys[r];
//   temperature[r] <= 0 (or NaN): the first index of the row's max (no filters).
// Rows whose weights are unusable (every logit -inf or NaN) take the argmax;
// a row with +inf logits takes its first +inf. Rows run in parallel on the pool.
void sample_rows_cpu(const float* logits, int64_t rows, int64_t vocab,
                     const float* temperature, const uint32_t* keys,
                     const SampleFilters& filters, int32_t* out);

} // namespace vllm_metal::cpu
