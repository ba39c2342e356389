// Quantized KV caches in the Metal kernels (layout: csrc/kv_quant.h).
//
// Function constant kv_quant: 0 float cache of the kernel's element type; 1
// int8, 2 fp8 e4m3, 3 fp8 e5m2 codes. A quantized cache is bytes: each head
// row holds HEAD_SIZE codes and then its float scale, and element i reads
// code_value(code[i]) * scale. The cache pointers keep the kernel's element
// type in their signatures and are read as bytes when kv_quant is set (a
// function constant: each specialization compiles one branch).
#pragma once

#include <metal_stdlib>

#include "kernel_constants.h"

using namespace metal;

#ifndef METAL_FUNC
#define METAL_FUNC inline
#endif

constant int kv_quant [[function_constant(VLLM_METAL_FC_KV_QUANT)]];

constant constexpr int kKvScaleBytes = 4;

// Cache elements from one head row to the next.
METAL_FUNC int kv_row_width(int head_size) {
  return kv_quant != 0 ? head_size + kKvScaleBytes : head_size;
}

// A code's value without its row's scale. e4m3 widens into an fp16 whose
// exponent bias is 15 instead of 7 (hence * 2^8); e5m2 is an fp16's top byte.
METAL_FUNC float kv_code_value(uchar c) {
  if (kv_quant == 1) return float(as_type<char>(c));
  if (kv_quant == 2) return float(as_type<half>(ushort(((c & 0x80u) << 8) | ((c & 0x7fu) << 7)))) * 256.0f;
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

// Element d of the cache row starting at element `row`, without its scale.
template <typename T>
METAL_FUNC float kv_element(device const T* cache, long row, int d) {
  if (kv_quant == 0) return float(cache[row + d]);
  return kv_code_value(reinterpret_cast<device const uchar*>(cache)[row + d]);
}

// The scale of the head row starting at element `row` (1 for a float cache).
template <typename T>
METAL_FUNC float kv_row_scale(device const T* cache, long row, int head_size) {
  if (kv_quant == 0) return 1.0f;
  return *reinterpret_cast<device const float*>(reinterpret_cast<device const uchar*>(cache) + row + head_size);
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
  if (kv_quant == 2) return kv_minifloat<3, 7>(v, 0x7eu);  // 0x7f is NaN in e4m3fn
  return kv_minifloat<2, 15>(v, 0x7bu);                     // 0x7c is infinity
}

// The largest code value: a row's max |x| maps onto it.
METAL_FUNC float kv_code_max() {
  return kv_quant == 1 ? 127.0f : kv_quant == 2 ? 448.0f : 57344.0f;
}
