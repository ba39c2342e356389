#include "cpu/attention/attention_output.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/attention/kv_quant_cpu.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

void load_span(const void* src, mlx::core::Dtype dtype, int64_t offset, float* dst, int64_t n, float mul) {
  switch (dtype) {
    case mlx::core::float16:
      decode_span<F16>(static_cast<const uint16_t*>(src) + offset, dst, n, mul);
      break;
    case mlx::core::bfloat16:
      decode_span<BF16>(static_cast<const uint16_t*>(src) + offset, dst, n, mul);
      break;
    default:
      decode_span<F32>(static_cast<const float*>(src) + offset, dst, n, mul);
  }
}

void store_span(void* dst, mlx::core::Dtype dtype, int64_t offset, const float* src, int64_t n, float mul) {
  switch (dtype) {
    case mlx::core::float16:
      encode_span<F16>(src, static_cast<uint16_t*>(dst) + offset, n, mul);
      break;
    case mlx::core::bfloat16:
      encode_span<BF16>(src, static_cast<uint16_t*>(dst) + offset, n, mul);
      break;
    default:
      encode_span<F32>(src, static_cast<float*>(dst) + offset, n, mul);
  }
}

AttentionItem sequence_item(const PagedAttentionArgs& p, int seq, int first_token, int rows, float* q,
                            const int32_t* row_lo, const int32_t* row_hi) {
  const int64_t qd = static_cast<int64_t>(rows) * p.num_heads * p.head_size;
  float q_scale = p.softcap > 0.0f ? p.scale : p.scale * kLog2e;
  // A rotated 4-bit cache holds rotated keys: the query gets the same
  // orthonormal rotation, 1 / sqrt(d) times the unnormalized Hadamard.
  const bool rotate = p.kv_quant == KvQuant::Rot4;
  if (rotate) q_scale /= std::sqrt(static_cast<float>(p.head_size));
  load_span(p.query, p.query_dtype, static_cast<int64_t>(first_token) * p.num_heads * p.head_size, q, qd,
            q_scale);
  if (rotate) {
    for (int64_t i = 0; i < qd; i += p.head_size) hadamard_in_place(q + i, p.head_size);
  }
  AttentionItem a;
  a.key_cache = p.key_cache;
  a.value_cache = p.value_cache;
  a.key_columns = p.key_columns;
  a.block_table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  a.num_blocks = p.num_blocks;
  a.block_size = p.block_size;
  a.num_kv_heads = p.num_kv_heads;
  a.head_size = p.head_size;
  a.q = q;
  a.rows = rows;
  a.group = p.num_heads / p.num_kv_heads;
  a.row_lo = row_lo;
  a.row_hi = row_hi;
  a.softcap = p.softcap;
  return a;
}

float exp2_diff(float x, float y) {
  return x == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp2(x - y);
}

__attribute__((noinline)) void fold_state(float& m, float& l, float* acc, float m2, float l2, const float* acc2,
                                          int d) {
  const float m_all = std::max(m, m2);
  const float w1 = exp2_diff(m, m_all);
  const float w2 = exp2_diff(m2, m_all);
  l = l * w1 + l2 * w2;
  for (int j = 0; j < d; ++j) acc[j] = acc[j] * w1 + acc2[j] * w2;
  m = m_all;
}

void write_output(const PagedAttentionArgs& p, int token, int head, float m, float l, const float* acc) {
  float carry = 1.0f;
  if (p.sinks != nullptr) {
    const float sink = p.sinks[head] * kLog2e;
    const float m_all = std::max(m, sink);
    carry = exp2_diff(m, m_all);
    l = l * carry + std::exp2(sink - m_all);
  }
  const float inv = l > 0.0f ? carry / l : 0.0f;
  const int64_t offset = (static_cast<int64_t>(token) * p.num_heads + head) * p.head_size;
  store_span(p.out, p.query_dtype, offset, acc, p.head_size, inv);
}

void merge_and_write(const PagedAttentionArgs& p, int token, int head, int n, const float* m, const float* l,
                     const float* acc, int64_t acc_stride, float* scratch) {
  const int d = p.head_size;
  float m_all = -std::numeric_limits<float>::infinity();
  for (int k = 0; k < n; ++k) m_all = std::max(m_all, m[k]);
  float l_all = 0.0f;
  std::fill(scratch, scratch + d, 0.0f);
  for (int k = 0; k < n; ++k) {
    const float w = exp2_diff(m[k], m_all);
    if (w == 0.0f || l[k] == 0.0f) continue;
    l_all += l[k] * w;
    const float* part = acc + k * acc_stride;
    for (int j = 0; j < d; ++j) scratch[j] += part[j] * w;
  }
  write_output(p, token, head, m_all, l_all, scratch);
}

}  // namespace vllm_metal::cpu
