// Parameter block of the expert-matmul kernel (experts_matmul), shared verbatim
// by the Metal sources and the host that encodes it (set as bytes at
// buffer(8)). Packed 4-byte scalars: Metal and C++ lay them out alike.
#pragma once

#ifndef __METAL_VERSION__
namespace vllm_metal::kernels {
#endif

struct ExpertParams {
  int rows;           // R: rows of x
  int pairs;          // P: (token, expert) pairs, rows of out
  int pairs_per_row;  // P / R: consecutive pairs sharing a row of x
  int in_features;    // K: columns of x and of each expert's matrix
  int out_features;   // N: rows of each expert's matrix, columns of out
  int experts;        // E: idx outside [0, E) gets NaN
  int group_size;     // quantized weights: columns per scale and bias
  int has_bias;       // 1: bias [E, N] at buffer(6) is added
};

#ifndef __METAL_VERSION__
}  // namespace vllm_metal::kernels
#endif
