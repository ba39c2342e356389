// Quantized KV cache formats (vLLM's --kv-cache-dtype fp8, fp8_e5m2,
// int8_per_token_head), shared by the ops, the CPU kernels and the dispatch.
//
// A quantized cache is uint8 [num_blocks, block_size, num_kv_heads,
// head_size + kKvScaleBytes]: each (token, KV head) row holds head_size
// one-byte codes, then the row's fp32 scale (native byte order), so a block
// carries everything needed to read it (copy-on-write, swapping, offloading
// copy blocks as bytes). Element i of the row is code_value(code[i]) * scale,
// with scale = max|x| / largest code value, set when the row is written.
#pragma once

namespace vllm_metal {

enum class KvQuant : int {
  None = 0, // the cache holds float16 / bfloat16 / float32 elements
  Int8 = 1, // symmetric int8 codes in [-127, 127]
  Fp8E4M3 = 2, // OCP e4m3fn codes (largest 448; no infinities)
  Fp8E5M2 = 3, // OCP e5m2 codes (largest finite 57344)
};

inline constexpr int kKvScaleBytes = 4;

// The cache's last dimension for `head_size` elements.
constexpr int kv_row_width(int head_size, KvQuant q) {
  return q == KvQuant::None ? head_size : head_size + kKvScaleBytes;
}

// The largest code value: a row's max |x| maps onto it.
constexpr float kv_code_max(KvQuant q) {
  return q == KvQuant::Int8 ? 127.0f : q == KvQuant::Fp8E4M3 ? 448.0f : 57344.0f;
}

} // namespace vllm_metal
