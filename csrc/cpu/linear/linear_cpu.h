// CPU drivers of the linear-layer ops: quantized and dense matmul, embedding
// gather. They pick the kernel shape (GEMV or tiled GEMM), the instruction
// set and the thread split; the SIMD bodies live in
// linear_gemv.inc and linear_gemm.inc.
#pragma once

#include <cstdint>

namespace vllm_metal::cpu {

// Floating storage formats the linear ops read and write.
enum class Elem : uint8_t { F32 = 0, BF16 = 1, F16 = 2 };

// MLX affine-quantized matrix [n, k]: element (r, c) is
// scales[r, c / gs] * q + biases[r, c / gs], q = bits-wide field
// c % (32 / bits) of w[r, c * bits / 32], lowest bits first.
//
// MXFP4 (mxfp4 true: OCP microscaling, MLX's mode "mxfp4"): bits 4, group
// size 32, each code an FP4 e2m1 value (tile_math.h kFp4Values), scales uint8
// E8M0 (2^(e - 127)), biases null: element (r, c) = fp4(q) * 2^(e - 127).
//
// Symmetric weights (GGUF's Q8_0 and Q4_0: W = d * (q - 2^(bits-1))) may
// leave biases null: each bias is then -zero_point * scale, formed from the
// scale already in hand, so a pass over W reads no biases. Only the int8
// kernels (linear_q8.h) take a null biases.
//
// Tiled (tiled true; int8 kernels and the embedding gather only): w, scales
// and biases hold the same elements in the int8 GEMM's order (linear_q8.h),
// rows taken 16 at a time: the rows [16t, 16t + h) (h = min(16, n - 16t)) of
// an [n, per_row] array are stored from element 16t * per_row on, as
// [per_row, h]. A tile's elements fill the range its rows held, so rows cut
// at multiples of 16 stay valid; tiled_offset gives an element's place.
struct QuantMatrix {
  const uint32_t* w;      // [n, k * bits / 32]
  const void* scales;     // [n, k / group_size]
  const void* biases;     // [n, k / group_size], or null (see above)
  Elem scale_type;        // of scales and biases
  int bits;               // 4 or 8
  int group_size;         // 32, 64 or 128
  int64_t n;
  int64_t k;
  float zero_point = 0.0f;  // read only when biases is null
  bool mxfp4 = false;       // see above: scale_type is then ignored (E8M0)
  bool tiled = false;       // see above
};

// Rows per tile of a tiled QuantMatrix.
constexpr int kQuantTileRows = 16;

// Element (r, j) of an [n, per_row] array of a QuantMatrix (w: per_row words,
// scales and biases: per_row groups), in its storage order.
inline int64_t quant_offset(bool tiled, int64_t n, int64_t per_row, int64_t r, int64_t j) {
  if (!tiled) return r * per_row + j;
  const int64_t r0 = r / kQuantTileRows * kQuantTileRows;
  const int64_t h = n - r0 < kQuantTileRows ? n - r0 : kQuantTileRows;
  return r0 * per_row + j * h + (r - r0);
}

// Dense matrix [n, k], row-contiguous.
struct DenseMatrix {
  const void* w;
  Elem type;
  int64_t n;
  int64_t k;
};

// out[m, n] = x[m, :] . W[n, :] (+ bias[n]); x and out row-contiguous.
struct LinearIO {
  const void* x;          // [m, k]
  Elem x_type;
  int64_t m;
  const void* bias;       // [n] or nullptr
  Elem bias_type;
  void* out;              // [m, n]
  Elem out_type;
  // Quantized W only: compute on x rounded to int8 per 32 columns
  // (linear_q8.h) instead of fp32 x.
  bool int8_activations = false;
};

void quantized_matmul_cpu(const QuantMatrix& w, const LinearIO& io);
// count products sharing one x (the same io.x, m, k, bits, group_size): for
// GEMV-sized m one pool job covers every matrix; otherwise one call each.
void quantized_matmuls_cpu(const QuantMatrix* ws, const LinearIO* ios, int count);
void dense_matmul_cpu(const DenseMatrix& w, const LinearIO& io);

// out[t, :] = row ids[t] of the table (dequantized for a quantized table),
// written as out_type. Raises std::out_of_range for an id outside [0, n).
void embedding_gather_dense_cpu(const DenseMatrix& table, const int32_t* ids, int64_t t,
                                void* out);
void embedding_gather_quant_cpu(const QuantMatrix& table, const int32_t* ids, int64_t t,
                                void* out, Elem out_type);

} // namespace vllm_metal::cpu
