#include "cpu/attention/kv_quant_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Round-to-nearest-even of |v| into a minifloat with `mant` mantissa bits and
// exponent bias `bias`, from the float's bits: normals drop 23 - mant mantissa
// bits (a carry moves into the exponent, as it should); below the smallest
// normal 2^(1 - bias) the codes are multiples of 2^(1 - bias - mant), which
// nearbyint rounds to (exact: the product is a power-of-two multiple).
template <int mant, int bias>
uint32_t minifloat_magnitude(float v) {
  const uint32_t a = bit_cast<uint32_t>(v) & 0x7fffffffu;
  constexpr int drop = 23 - mant;
  constexpr uint32_t smallest_normal = static_cast<uint32_t>(127 + 1 - bias) << 23;
  if (a >= smallest_normal) {
    const uint32_t r = (a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop;
    return r - (static_cast<uint32_t>(127 - bias) << mant);
  }
  constexpr float steps = static_cast<float>(1u << (bias - 1 + mant)); // 1 / smallest subnormal
  return static_cast<uint32_t>(std::nearbyint(bit_cast<float>(a) * steps));
}

template <int mant, int bias>
uint8_t minifloat(float v, uint32_t largest) {
  const uint32_t sign = (bit_cast<uint32_t>(v) >> 24) & 0x80u;
  return static_cast<uint8_t>(sign | std::min(minifloat_magnitude<mant, bias>(v), largest));
}

} // namespace

void quantize_token(const float* k, const float* v, int num_kv_heads, int d, KvQuant q, uint8_t* k_dst,
                    uint8_t* v_dst) {
  const int64_t width = kv_row_width(d, q);
  for (int h = 0; h < num_kv_heads; ++h) {
    quantize_head_row(k + int64_t(h) * d, d, q, k_dst + h * width);
    quantize_head_row(v + int64_t(h) * d, d, q, v_dst + h * width);
  }
}

float kv_code_value(uint8_t code, KvQuant q) {
  switch (q) {
    case KvQuant::Int8:
      return I8::to_float(static_cast<int8_t>(code));
    case KvQuant::Fp8E4M3:
      return E4M3::to_float(code) * E4M3::kRawScale;
    case KvQuant::Fp8E5M2:
      return E5M2::to_float(code);
    default:
      throw std::invalid_argument("kv_code_value: not a quantized KV format");
  }
}

void quantize_head_row(const float* x, int d, KvQuant q, uint8_t* dst) {
  // A NaN anywhere makes the scale NaN, so the row reads back as NaN (as a
  // float cache would) instead of as saturated codes.
  float amax = 0.0f;
  for (int i = 0; i < d; ++i) {
    const float a = std::fabs(x[i]);
    amax = (a > amax || a != a) && amax == amax ? a : amax;
  }
  const float scale = amax / kv_code_max(q);
  for (int i = 0; i < d; ++i) {
    const float v = scale > 0.0f ? x[i] / scale : 0.0f;
    switch (q) {
      case KvQuant::Int8:
        dst[i] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.0f, 127.0f)));
        break;
      case KvQuant::Fp8E4M3:
        dst[i] = minifloat<3, 7>(v, 0x7eu); // 0x7f is NaN in e4m3fn
        break;
      case KvQuant::Fp8E5M2:
        dst[i] = minifloat<2, 15>(v, 0x7bu); // 0x7c is inf
        break;
      default:
        throw std::invalid_argument("quantize_head_row: not a quantized KV format");
    }
  }
  std::memcpy(dst + d, &scale, sizeof(float));
}

} // namespace vllm_metal::cpu
