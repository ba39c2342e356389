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

// The float16 nearest x (ties to even) in one rounding: float32 rounded to odd
// first (kept inexact in its last bit), so the float16 rounding sees the
// float64 value's side of every float16 midpoint, as numpy's direct
// float64 -> float16 does.
uint16_t half_of(double x) {
  float f = static_cast<float>(x);
  if (std::isfinite(f) && static_cast<double>(f) != x) {
    uint32_t b = bit_cast<uint32_t>(f);
    if (std::fabs(static_cast<double>(f)) > std::fabs(x)) --b; // one step towards zero
    f = bit_cast<float>(b | 1u);
  }
  return F16::from_float(f);
}

template <typename T>
void hadamard_unnormalized(T* x, int d) {
  for (int h = 1; h < d; h *= 2) {
    for (int i = 0; i < d; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = x[j];
        const T b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// A Rot4 key row (kv_quant.h): the nearest of the levels of N(0, 1/d) to each
// coordinate of the rotated unit direction, then the norm-corrected factor.
void rot4_key_row(const float* x, int d, uint8_t* dst) {
  double r[256];
  for (int i = 0; i < d; ++i) r[i] = x[i];
  hadamard_unnormalized(r, d);
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  double sq = 0.0;
  for (int i = 0; i < d; ++i) {
    r[i] *= inv_sqrt_d;
    sq += r[i] * r[i];
  }
  const double norm = std::sqrt(sq);
  double edges[15]; // midpoints of neighbouring levels of N(0, 1/d)
  for (int i = 0; i < 15; ++i) edges[i] = (kRot4Levels[i] + kRot4Levels[i + 1]) * inv_sqrt_d / 2.0;
  double picked = 0.0;
  for (int i = 0; i < d; ++i) {
    const double unit = norm > 0.0 ? r[i] / norm : 0.0;
    int code = 0;
    while (code < 15 && edges[code] < unit) ++code; // the first edge at or above it
    picked += kRot4Levels[code] * kRot4Levels[code];
    if (i % 2 == 0) {
      dst[i / 2] = static_cast<uint8_t>(code);
    } else {
      dst[i / 2] |= static_cast<uint8_t>(code << 4);
    }
  }
  const double norm16 = F16::to_float(half_of(norm));
  const float factor = static_cast<float>(norm16 / std::sqrt(picked));
  std::memcpy(dst + d / 2, &factor, sizeof(float));
}

// A Rot4 value row (kv_quant.h): codes against the float16-rounded step and
// minimum, ties to the even code; a NaN makes the step NaN (the row reads NaN).
void rot4_value_row(const float* x, int d, uint8_t* dst) {
  double lo = x[0];
  double hi = x[0];
  bool nan = false;
  for (int i = 0; i < d; ++i) {
    nan |= x[i] != x[i];
    lo = std::min(lo, static_cast<double>(x[i]));
    hi = std::max(hi, static_cast<double>(x[i]));
  }
  const uint16_t minimum = half_of(nan ? std::nan("") : lo);
  const uint16_t step = half_of(nan ? std::nan("") : (hi - lo) / 15.0);
  const double m = F16::to_float(minimum);
  const double s = F16::to_float(step);
  for (int i = 0; i < d; ++i) {
    const int code = s > 0.0 ? static_cast<int>(std::clamp(std::nearbyint((x[i] - m) / s), 0.0, 15.0)) : 0;
    if (i % 2 == 0) {
      dst[i / 2] = static_cast<uint8_t>(code);
    } else {
      dst[i / 2] |= static_cast<uint8_t>(code << 4);
    }
  }
  std::memcpy(dst + d / 2, &step, sizeof(uint16_t));
  std::memcpy(dst + d / 2 + 2, &minimum, sizeof(uint16_t));
}

} // namespace

void hadamard_in_place(float* x, int d) {
  hadamard_unnormalized(x, d);
}

void quantize_token(const float* k, const float* v, int num_kv_heads, int d, KvQuant q, uint8_t* k_dst,
                    uint8_t* v_dst) {
  if (!kv_head_size_ok(d, q)) throw std::invalid_argument("quantize_token: 4-bit rows take head sizes 64, 128, 256");
  const int64_t k_width = kv_key_width(d, q);
  const int64_t v_width = kv_value_width(d, q);
  const KvQuant kq = kv_key_format(q);
  const KvQuant vq = kv_value_format(q);
  for (int h = 0; h < num_kv_heads; ++h) {
    if (kq == KvQuant::Rot4) {
      rot4_key_row(k + int64_t(h) * d, d, k_dst + h * k_width);
    } else {
      quantize_head_row(k + int64_t(h) * d, d, kq, k_dst + h * k_width);
    }
    if (vq == KvQuant::Rot4) {
      rot4_value_row(v + int64_t(h) * d, d, v_dst + h * v_width);
    } else {
      quantize_head_row(v + int64_t(h) * d, d, vq, v_dst + h * v_width);
    }
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
