// Quantized KV caches in the Metal kernels (layout: csrc/kv_quant.h).
//
// Function constant kv_quant: 0 float cache of the kernel's element type; 1
// int8, 2 fp8 e4m3, 3 fp8 e5m2 codes, 4 rotated 4-bit (Rot4), 5 e4m3 keys with
// Rot4's value rows (K8V4: its K and V rows differ in width). A quantized
// cache is bytes: each head row of formats 1-3 holds HEAD_SIZE codes and then
// its float scale, and element i reads code_value(code[i]) * scale. A Rot4 row
// holds two 4-bit codes a byte, then 4 bytes: keys read kRot4Levels[code] *
// the float after the codes (the rotated key: the kernels rotate the query
// alike, hadamard_simd), values minimum + code * step (the float16 step, then
// the float16 minimum). The cache pointers keep the kernel's element type in
// their signatures and are read as bytes when kv_quant is set (a function
// constant: each specialization compiles one branch).
#pragma once

#include <metal_stdlib>

#include "kernel_constants.h"

using namespace metal;

#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif

constant int kv_quant [[function_constant(VLLM_METAL_FC_KV_QUANT)]];

constant constexpr int kKvScaleBytes = 4;

// Key codes are e4m3 (formats 2 and 5); value rows are Rot4's (4 and 5).
METAL_FUNC bool kv_e4m3() {
  return kv_quant == 2 || kv_quant == 5;
}
METAL_FUNC bool kv_nibble_values() {
  return kv_quant == 4 || kv_quant == 5;
}

// Cache elements from one key head row to the next.
METAL_FUNC int kv_row_width(int head_size) {
  if (kv_quant == 4) return head_size / 2 + kKvScaleBytes;
  return kv_quant != 0 ? head_size + kKvScaleBytes : head_size;
}

// The same for value rows.
METAL_FUNC int kv_value_row_width(int head_size) {
  return kv_nibble_values() ? head_size / 2 + kKvScaleBytes : kv_row_width(head_size);
}

// The Lloyd-Max levels of N(0, 1), ascending (csrc/kv_quant.h kRot4Levels).
constant constexpr float kRot4Levels[16] = {
    -2.7325895709929995f, -2.0690172265289424f, -1.6180463860193919f, -1.2562311973448297f,
    -0.9423404564849315f, -0.6567591185308979f, -0.3880482994893026f, -0.12839502985080997f,
    0.12839502985080997f, 0.3880482994893026f,  0.6567591185308979f,  0.9423404564849315f,
    1.2562311973448297f,  1.6180463860193919f,  2.0690172265289424f,  2.7325895709929995f};

// Element d's 4-bit code in the Rot4 row starting at byte `row`.
template <typename T>
METAL_FUNC uint kv_nibble(device const T* cache, long row, int d) {
  return (uint(reinterpret_cast<device const uchar*>(cache)[row + d / 2]) >> (4 * (d & 1))) & 15u;
}

// x <- H x over a head row spread across a simdgroup, ELEMS elements a lane:
// element d's bits are split between the lane index and i (d = lane + 32 i,
// or d = lane * ELEMS + i: the transform is a butterfly over every bit of d,
// whichever holds it). H is the unnormalized Sylvester-Hadamard matrix, so
// times 1 / sqrt(32 ELEMS) it is the orthonormal rotation of Rot4 keys.
template <int ELEMS>
METAL_FUNC void hadamard_simd(thread float* x, uint lane) {
  for (int s = 1; s < ELEMS; s *= 2) {
    for (int i = 0; i < ELEMS; ++i) {
      if ((i & s) == 0) {
        const float a = x[i];
        const float b = x[i + s];
        x[i] = a + b;
        x[i + s] = a - b;
      }
    }
  }
  for (ushort s = 1; s < 32; s *= 2) {
    for (int i = 0; i < ELEMS; ++i) {
      const float other = simd_shuffle_xor(x[i], s);
      x[i] = (lane & s) != 0 ? other - x[i] : x[i] + other;
    }
  }
}

// A code's value without its row's scale. e4m3 widens into an fp16 whose
// exponent bias is 15 instead of 7 (hence * 2^8); e5m2 is an fp16's top byte.
METAL_FUNC float kv_code_value(uchar c) {
  if (kv_quant == 1) return float(as_type<char>(c));
  if (kv_e4m3()) return float(as_type<half>(ushort(((c & 0x80u) << 8) | ((c & 0x7fu) << 7)))) * 256.0f;
  return float(as_type<half>(ushort(ushort(c) << 8)));
}

// N elements (a multiple of 4, 4-aligned) of a cache row at element `offset`
// as floats, without the row's scale.
template <typename T, int N>
METAL_FUNC void load_kv(device const T* cache, long offset, thread float* dst) {
  if (kv_quant == 0) {
    for (int i = 0; i < N; i += 4) {
      const float4 v = float4(*reinterpret_cast<device const vec<T, 4>*>(cache + offset + i));
      dst[i] = v.x;
      dst[i + 1] = v.y;
      dst[i + 2] = v.z;
      dst[i + 3] = v.w;
    }
    return;
  }
  device const uchar* codes = reinterpret_cast<device const uchar*>(cache) + offset;
  for (int i = 0; i < N; i += 4) {
    const uchar4 c = *reinterpret_cast<device const uchar4*>(codes + i);
    dst[i] = kv_code_value(c.x);
    dst[i + 1] = kv_code_value(c.y);
    dst[i + 2] = kv_code_value(c.z);
    dst[i + 3] = kv_code_value(c.w);
  }
}

// Element d of the key (value) row starting at element `row`, without its
// scale (values: nor their bias).
template <typename T>
METAL_FUNC float kv_key_element(device const T* cache, long row, int d) {
  if (kv_quant == 0) return float(cache[row + d]);
  if (kv_quant == 4) return kRot4Levels[kv_nibble(cache, row, d)];
  return kv_code_value(reinterpret_cast<device const uchar*>(cache)[row + d]);
}

template <typename T>
METAL_FUNC float kv_value_element(device const T* cache, long row, int d) {
  if (kv_nibble_values()) return float(kv_nibble(cache, row, d));
  return kv_key_element(cache, row, d);
}

// The bytes after a Rot4 row's codes.
template <typename T, typename U>
METAL_FUNC U kv_rot4_tail(device const T* cache, long row, int head_size, int at) {
  return *reinterpret_cast<device const U*>(reinterpret_cast<device const uchar*>(cache) + row + head_size / 2 + at);
}

// The scale of the key (value) row starting at element `row` (1 for a float
// cache; a Rot4 key's factor, a Rot4 value's step).
template <typename T>
METAL_FUNC float kv_key_scale(device const T* cache, long row, int head_size) {
  if (kv_quant == 0) return 1.0f;
  if (kv_quant == 4) return kv_rot4_tail<T, float>(cache, row, head_size, 0);
  return *reinterpret_cast<device const float*>(reinterpret_cast<device const uchar*>(cache) + row + head_size);
}

template <typename T>
METAL_FUNC float kv_value_scale(device const T* cache, long row, int head_size) {
  if (kv_nibble_values()) return float(kv_rot4_tail<T, half>(cache, row, head_size, 0));
  return kv_key_scale(cache, row, head_size);
}

// What every element of a value row adds after its scale: a Rot4 row's
// minimum, else 0.
template <typename T>
METAL_FUNC float kv_value_bias(device const T* cache, long row, int head_size) {
  return kv_nibble_values() ? float(kv_rot4_tail<T, half>(cache, row, head_size, 2)) : 0.0f;
}

// N elements of a key (value) row at element d of the row starting at `row`,
// as load_kv gives them (Rot4: levels for keys, codes for values).
template <typename T, int N>
METAL_FUNC void load_key(device const T* cache, long row, int d, thread float* dst) {
  if (kv_quant != 4) return load_kv<T, N>(cache, row + d, dst);
  for (int i = 0; i < N; ++i) dst[i] = kRot4Levels[kv_nibble(cache, row, d + i)];
}

template <typename T, int N>
METAL_FUNC void load_value(device const T* cache, long row, int d, thread float* dst) {
  if (!kv_nibble_values()) return load_kv<T, N>(cache, row + d, dst);
  for (int i = 0; i < N; ++i) dst[i] = float(kv_nibble(cache, row, d + i));
}

// Round-to-nearest-even of v into a minifloat with MANT mantissa bits and
// exponent bias BIAS (sign included), saturating at the code `largest`:
// normals drop 23 - MANT mantissa bits of the float (a carry moves into the
// exponent); below the smallest normal the codes are multiples of the
// smallest subnormal, which rint reaches exactly.
template <int MANT, int BIAS>
METAL_FUNC uchar kv_minifloat(float v, uint largest) {
  const uint bits = as_type<uint>(v);
  const uint a = bits & 0x7fffffffu;
  constexpr int drop = 23 - MANT;
  constexpr uint smallest_normal = uint(127 + 1 - BIAS) << 23;
  uint code;
  if (a >= smallest_normal) {
    code = ((a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop) - (uint(127 - BIAS) << MANT);
  } else {
    code = uint(rint(as_type<float>(a) * float(1u << (BIAS - 1 + MANT))));
  }
  return uchar(((bits >> 24) & 0x80u) | min(code, largest));
}

// The code of v = x / scale.
METAL_FUNC uchar kv_encode(float v) {
  if (kv_quant == 1) return as_type<uchar>(char(clamp(rint(v), -127.0f, 127.0f)));
  if (kv_e4m3()) return kv_minifloat<3, 7>(v, 0x7eu);  // 0x7f is NaN in e4m3fn
  return kv_minifloat<2, 15>(v, 0x7bu);                     // 0x7c is infinity
}

// The largest code value: a row's max |x| maps onto it.
METAL_FUNC float kv_code_max() {
  return kv_quant == 1 ? 127.0f : kv_e4m3() ? 448.0f : 57344.0f;
}
