// Quantized KV cache formats (vLLM's --kv-cache-dtype fp8, fp8_e5m2,
// int8_per_token_head, turboquant_4bit_nc, turboquant_k8v4), shared by the ops,
// the CPU kernels and the dispatch.
//
// A quantized cache is uint8 [num_blocks, block_size, num_kv_heads,
// head_size + kKvScaleBytes]: each (token, KV head) row holds head_size
// one-byte codes, then the row's fp32 scale (native byte order), so a block
// carries everything needed to read it (copy-on-write, swapping, offloading
// copy blocks as bytes). Element i of the row is code_value(code[i]) * scale,
// with scale = max|x| / largest code value, set when the row is written.
//
// Rot4 (turboquant_4bit_nc, vllm_metal/attention/rotated_kv.py defines it)
// packs two 4-bit codes per byte (element 2i in the low nibble, 2i + 1 in the
// high one): a row is head_size / 2 code bytes and 4 bytes after them, the
// same width for K and V.
//   K: codes index the 16 Lloyd-Max levels of N(0, 1) (kRot4Levels) of the
//      row rotated by the orthonormal Hadamard matrix and scaled to unit
//      length; the fp32 after them is float16(|k|) / |levels picked|, so the
//      rotated key reads back as levels[code] * that factor. Attention scores
//      the rotated query against it (a rotation keeps dot products).
//   V: codes of 16 even steps from the row's minimum; float16 step, then
//      float16 minimum after them; element i reads minimum + code * step.
//
// K8V4 (turboquant_k8v4): Fp8E4M3's key rows (head_size + 4 bytes) and Rot4's
// value rows (head_size / 2 + 4): its K and V caches differ in their last
// dimension.
#pragma once

namespace vllm_metal {

enum class KvQuant : int {
  None = 0, // the cache holds float16 / bfloat16 / float32 elements
  Int8 = 1, // symmetric int8 codes in [-127, 127]
  Fp8E4M3 = 2, // OCP e4m3fn codes (largest 448; no infinities)
  Fp8E5M2 = 3, // OCP e5m2 codes (largest finite 57344)
  Rot4 = 4, // rotated 4-bit keys, 4-bit uniform values (see above)
  K8V4 = 5, // e4m3 keys, Rot4's values (see above)
};

inline constexpr int kKvQuantLast = static_cast<int>(KvQuant::K8V4);

inline constexpr int kKvScaleBytes = 4;

// The key cache's last dimension for `head_size` elements.
constexpr int kv_key_width(int head_size, KvQuant q) {
  return q == KvQuant::None ? head_size : q == KvQuant::Rot4 ? head_size / 2 + kKvScaleBytes
                                                             : head_size + kKvScaleBytes;
}

// The value cache's.
constexpr int kv_value_width(int head_size, KvQuant q) {
  return q == KvQuant::K8V4 ? head_size / 2 + kKvScaleBytes : kv_key_width(head_size, q);
}

// What a row of K (V) is coded as: K8V4 is Fp8E4M3's keys and Rot4's values.
constexpr KvQuant kv_key_format(KvQuant q) {
  return q == KvQuant::K8V4 ? KvQuant::Fp8E4M3 : q;
}
constexpr KvQuant kv_value_format(KvQuant q) {
  return q == KvQuant::K8V4 ? KvQuant::Rot4 : q;
}

// Rot4's key levels: the minimum mean-squared-error 16-level quantizer of
// N(0, 1) (Lloyd-Max), ascending, as rotated_kv.lloyd_max_levels(1, 4) computes
// them (tests/ops/test_rotated_kv_cache.py compares the codes and the keys
// read back with its numpy codec).
inline constexpr double kRot4Levels[16] = {
    -2.7325895709929995, -2.0690172265289424, -1.6180463860193919, -1.2562311973448297,
    -0.9423404564849315, -0.6567591185308979, -0.3880482994893026, -0.12839502985080997,
    0.12839502985080997, 0.3880482994893026, 0.6567591185308979, 0.9423404564849315,
    1.2562311973448297, 1.6180463860193919, 2.0690172265289424, 2.7325895709929995,
};

// Whether the format takes this head size: formats with 4-bit rows are read
// by the pieces kernel only (and Rot4 keys need a Hadamard rotation), so 64,
// 128 and 256.
// The head sizes the CPU pieces kernel takes: the only reader of 4-bit rows
// and of key columns.
constexpr bool pieces_head_size(int head_size) {
  return head_size == 64 || head_size == 128 || head_size == 256;
}

constexpr bool kv_head_size_ok(int head_size, KvQuant q) {
  return (q != KvQuant::Rot4 && q != KvQuant::K8V4) || pieces_head_size(head_size);
}

// The largest code value: a row's max |x| maps onto it.
constexpr float kv_code_max(KvQuant q) {
  return q == KvQuant::Int8 ? 127.0f : q == KvQuant::Fp8E4M3 ? 448.0f : 57344.0f;
}

} // namespace vllm_metal
