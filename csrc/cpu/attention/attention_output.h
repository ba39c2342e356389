// Loading, storing and finishing softmax states, shared by the CPU routes
// (varlen / split-KV in paged_attention_cpu.cpp, GQA decode in gqa_decode_cpu.cpp).
#pragma once

#include <cstdint>

#include "cpu/attention/attention_item.h"
#include "cpu/attention/paged_attention_cpu.h"
#include "mlx/dtype.h"

namespace vllm_metal::cpu {

inline constexpr float kLog2e = 1.4426950408889634f;

// dst[0:n] = float(src[offset : offset + n]) * mul, for any float dtype.
void load_span(const void* src, mlx::core::Dtype dtype, int64_t offset, float* dst, int64_t n, float mul);

// dst[offset : offset + n] = src[0:n] * mul, rounded to dtype.
void store_span(void* dst, mlx::core::Dtype dtype, int64_t offset, const float* src, int64_t n, float mul);

// The fields of a work item that come from the call: sequence `seq`'s block
// table and the cache, its query rows [first_token, first_token + rows) loaded
// into q (fp32, scaled for the log2-domain softmax) and their key bounds. The
// caller sets the state (m, l, acc) and scratch pointers.
AttentionItem sequence_item(const PagedAttentionArgs& p, int seq, int first_token, int rows, float* q,
                            const int32_t* row_lo, const int32_t* row_hi);

// 2^(x - y) for y >= x, where x may be -inf.
float exp2_diff(float x, float y);

// Normalize one (token, head) from its log2-domain softmax state (max m,
// exp-sum l, unnormalized acc[head_size]) and write it out; a sink adds
// 2^(sink - max) to the denominator only. Nothing attended -> zeros.
void write_output(const PagedAttentionArgs& p, int token, int head, float m, float l, const float* acc);

// Merge n softmax states (m[k], l[k], acc[k * head_size]) into one and write it.
void merge_and_write(const PagedAttentionArgs& p, int token, int head, int n, const float* m, const float* l,
                     const float* acc, int64_t acc_stride, float* scratch);

}  // namespace vllm_metal::cpu
