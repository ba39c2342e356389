// Writing rows of a quantized KV cache on the CPU (kv_quant.h says the layout).
#pragma once

#include <cstdint>

#include "kv_quant.h"

namespace vllm_metal::cpu {

// x[0:d] -> dst[0:d] codes, then the fp32 scale in dst[d:d + 4].
// scale = max|x| / kv_code_max(q) (0 for an all-zero row, whose codes are 0;
// NaN if x holds a NaN);
// code = round-to-nearest-even(x / scale) in the format, saturating at the
// largest code. q must not be KvQuant::None.
void quantize_head_row(const float* x, int d, KvQuant q, uint8_t* dst);

// One token's K and V rows [num_kv_heads, d] (float32) into the cache rows of
// its slot: k_dst / v_dst point at the slot's first head row, rows
// kv_key_width(d, q) / kv_value_width(d, q) bytes apart. Rot4 rows (K8V4's
// values too) are coded as kv_quant.h says, in float64 (the numpy codec's
// arithmetic, so the codes match it).
void quantize_token(const float* k, const float* v, int num_kv_heads, int d, KvQuant q, uint8_t* k_dst,
                    uint8_t* v_dst);

// x[0:d] <- H x with H the unnormalized Sylvester-Hadamard matrix
// (H[i][j] = (-1)^popcount(i & j)); d a power of 2. Rotating a query for a
// Rot4 cache: times 1 / sqrt(d) is the orthonormal rotation its keys had.
void hadamard_in_place(float* x, int d);

// The value of one code without its scale (for tests and scalar paths).
float kv_code_value(uint8_t code, KvQuant q);

} // namespace vllm_metal::cpu
