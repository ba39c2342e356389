// Quantized matmul on int8 activations (opt-in: LinearIO::int8_activations).
//
// The fp32 path spends most of its instructions turning 4-bit codes into
// floats; here x is quantized once per row to int8 in 32-column blocks
// (d = max|x| / 127, q = round-to-nearest-even(x * 127 / max|x|)), and the
// code-by-activation products are exact integer dot products (AVX512-VNNI
// vpdpbusd: 64 multiply-adds per instruction). Per output:
//
//   y[m, n] = sum_g scale[n, g] * sum_{b in g} d[m, b] * sum_{c in b} code[n, c] * q[m, c]
//           + sum_g bias[n, g] * xsum[m, g]
//
// with xsum the fp32 sum of x over group g (so the biases' share is exact).
// The numbers differ from the fp32 path by the activation rounding alone
// (relative error ~1e-3 on a dot product); llama.cpp's CPU kernels make the
// same trade.
#pragma once

#include <cstdint>
#include <memory>

#include "cpu/runtime/isa.h"
#include "cpu/linear/linear_cpu.h"
#include "cpu/runtime/scratch.h"

namespace vllm_metal::cpu {

// Rows of x quantized for one (bits, group_size). For 4 bits, within each
// 32-column block the even columns come first, then the odd ones, the order a
// packed byte's (low, high) nibbles meet them in, and each block's 32 bytes
// are one row of an AMX tile; 8-bit rows keep x's order. Rows are zero-padded
// to whole chunks (kChunk4 / kChunk8 columns).
struct Q8Acts {
  int64_t m = 0;
  int64_t k = 0;
  int64_t kp = 0;      // padded row length of q
  int bits = 4;
  int group_size = 32;
  ScratchArray<int8_t> q;    // [m, kp]
  ScratchArray<float> d;     // [m, kp / 32]: each 32-column block's step
  ScratchArray<float> xsum;  // [m, k / group_size]
};

constexpr int kQ8Block = 32;
constexpr int kChunk4 = 128; // columns per 64-byte load of 4-bit codes
constexpr int kChunk8 = 64;  // of 8-bit codes

// Position of column c of x within a quantized row.
inline int64_t q8_position(int64_t c, int bits) {
  if (bits != 4) return c;
  const int64_t base = c / kQ8Block * kQ8Block, r = c % kQ8Block;
  return base + (r & 1) * (kQ8Block / 2) + r / 2;
}

Q8Acts quantize_acts(const LinearIO& io, int64_t k, int bits, int group_size);

// One kernel shape for every number of rows: each output is computed by the
// same operations in the same order whether its row of x comes alone or with
// others, so a request's tokens do not depend on the batch it shares a step
// with. The AVX-512 kernel's order (per output, blocks left to right; the
// portable kernel has its own, also fixed per output):
//
//   acc = 0
//   for each group g: for each block b of g:
//       acc = fma(float(dot_b), scale[n, g] * d[m, b], acc)   (dot_b exact, int32)
//     acc = fma(bias[n, g], xsum[m, g], acc)
//
// W is read by tiles of kQ8TileCols rows (QuantMatrix's tiled order): a tiled
// W in place; W in MLX's layout is repacked into that order tile by tile, and
// gives the same bits, slower for a few rows.
struct Q8Kernels {
  // Quantize one fp32 row x [k] into q [kp] (positions q8_position), d
  // and xsum of that row; the padding is written as zeros.
  void (*quantize_row)(const float* x, int64_t k, int64_t kp, int bits, int group_size,
                       int8_t* q, float* d, float* xsum);
  // y[(i - r0) * ldy + c - n0] for rows i in [r0, r1) of a, c in [n0, n1)
  // (n0 a multiple of kQ8TileCols); scratch holds q8_tile_scratch(w) bytes.
  void (*gemm)(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
               int64_t n1, float* y, int64_t ldy, void* scratch);
};

// Calls with fewer rows of x take the VNNI kernel even where AMX tiles are on:
// widening each tile's codes (and the rows' A tiles) costs as much as AMX
// saves at 16-48 rows (0.8-1.2x on SmolLM2's and TinyLlama's shapes,
// benchmarks/bench_amx.py); at 64, 1.3x.
constexpr int64_t kQ8AmxMinRows = 64;

// Output columns per GEMM tile (one 512-bit vector of int32 lanes).
constexpr int kQ8TileCols = kQuantTileRows;
// Bytes of one repacked GEMM tile: its codes word-interleaved, scales and biases as fp32.
int64_t q8_tile_scratch(const QuantMatrix& w);

const Q8Kernels& q8_kernels_generic();
#if VLLM_METAL_X86_DISPATCH
// nullptr when the CPU lacks AVX512-VNNI (or the active ISA is lowered).
const Q8Kernels* q8_kernels_vnni();
#endif
const Q8Kernels& q8_kernels();

// y[(i - r0) * ldy + c - n0] = row i of a . row c of W, for i in [r0, r1) and
// c in [n0, n1) (n0 a multiple of kQ8TileCols): the kernel with this thread's
// scratch (the expert matmul's per-expert products).
void q8_products(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
                 int64_t n1, float* y, int64_t ldy);

void quantized_matmul_q8_cpu(const QuantMatrix& w, const LinearIO& io);
// As quantized_matmuls_cpu: the matrices share io.x, which is quantized once.
void quantized_matmuls_q8_cpu(const QuantMatrix* ws, const LinearIO* ios, int count);

} // namespace vllm_metal::cpu
