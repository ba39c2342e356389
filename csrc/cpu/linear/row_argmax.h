// The index of each row's largest value, as mx.argmax numbers it: the first
// NaN if the row has one, else the first occurrence of the maximum.
//
// It serves greedy decoding straight from the head's output (ops
// quantized_matmul's argmax_columns): one pass over the logits on the pool,
// while they are still in the caches, instead of MLX's single-threaded
// argmax node (~40 us for a 49k vocab) and its int32 cast.
#pragma once

#include <cstdint>

namespace vllm_metal::cpu {

// x float32 [rows, ld] -> out[r] = argmax of x[r, 0:n] (n >= 1, n <= ld).
//
// allowed (a grammar's bitmask, or null): uint32 [rows, allowed_ld] with
// allowed_ld >= ceil(n / 32); bit c % 32 of word c / 32 admits column c. The
// others count as -inf, as if masked before the argmax (a row admitting
// nothing, or only -inf, gives 0).
void row_argmax_cpu(const float* x, int64_t rows, int64_t ld, int64_t n, int32_t* out,
                    const uint32_t* allowed = nullptr, int64_t allowed_ld = 0);

} // namespace vllm_metal::cpu
