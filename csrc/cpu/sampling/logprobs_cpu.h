// The logprobs vLLM returns for each sampled (or prompt) token, in one pass
// per row: MLX's CPU backend builds them from logsumexp, a comparison count,
// argpartition and argsort over the whole vocab (~1.5 ms per 49k-token row,
// 20-30 ms for 16 rows, next to a 27 ms decode step).
#pragma once

#include <cstdint>

namespace vllm_metal::cpu {

// x float32 [rows, vocab] (row-contiguous), token int32 [rows], k >= 0 ->
//   ids int32 [rows, k + 1], vals float32 [rows, k + 1], ranks int32 [rows].
// Scores are x - logsumexp(x) when `normalize` (log-probabilities), else x.
// Column 0 is token[r] and its score; columns 1..k the k largest scores in
// descending order (ties: lower id first), padded with id 0 and -inf past the
// vocab; ranks[r] = the number of scores >= the token's. Order and ranks are
// taken on x (exact), so rounding in the scores never reorders them. Rows run
// on the pool.
void top_logprobs_cpu(const float* x, int64_t rows, int64_t vocab, const int32_t* token,
                      int64_t k, bool normalize, int32_t* ids, float* vals, int32_t* ranks);

} // namespace vllm_metal::cpu
