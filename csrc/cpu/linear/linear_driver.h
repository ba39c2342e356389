// Pieces of the linear ops' drivers shared by the fp32 (linear_cpu.cpp) and
// int8-activation (linear_q8.cpp) quantized paths: column blocking, the
// output conversion, the pool split.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "cpu/linear/linear_cpu.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu::driver {

// Below this much weight traffic a single thread is faster than waking the pool.
constexpr int64_t kSerialBytes = 128 * 1024;

// f(T{}) for the storage type T (F32, BF16, F16) of t.
template <typename F>
void for_types(Elem t, F&& f) {
  switch (t) {
    case Elem::F32:
      return f(F32{});
    case Elem::BF16:
      return f(BF16{});
    default:
      return f(F16{});
  }
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Up to this many rows of x, weights are decoded in registers per chunk of
// rows (GEMV); above it fp32 panels of W are decoded once and reused (GEMM).
// Crossovers measured on Zen 4 (AVX-512) at SmolLM2's shapes.
constexpr int64_t kQuantGemvMaxRows = 12;
constexpr int64_t kDenseGemvMaxRows = 12;
// A float-path W (dense, or an expert's) with at most this many rows (outputs)
// takes the GEMM for every row count: the GEMM's per-output sum (one FMA per
// column, in column order) does not depend on how many rows x has, so a
// router's choice or a latent head's product for a token does not depend on
// its batch (the GEMV sums in another order). At these sizes packing W per
// call costs microseconds.
constexpr int64_t kInvariantMaxCols = 512;
// Rows of x per GEMV call (one weight decode serves them all).
constexpr int kGemvRows = 4;
// Columns per GEMV sub-range when x has several chunks of rows: the
// sub-range's weights stay in L1 from one chunk to the next.
constexpr int64_t kGemvSubCols = 16;

// x as fp32 rows [m, k] (the input itself when it already is, else a copy, in
// nibble order when `nibble`); xsum [m, k / gs] each group's sum (gs > 0).
struct PreparedX {
  const float* x = nullptr;
  ScratchArray<float> owned;
  ScratchArray<float> xsum;
};

// Row i of the result is row rows[i] of io.x when `rows` is given (a gather:
// always a copy), else row i.
PreparedX prepare_x(const LinearIO& io, int64_t k, bool nibble, int gs,
                    const int32_t* rows = nullptr);

// GEMM tile rows: an L2-sized fp32 tile of whole panel pairs, but no more
// than one item's share.
int64_t tile_rows(int64_t n, int64_t k, bool parallel, int panel_rows);

// Per-thread panel buffer for `rows` rows of k (plus one panel of scratch),
// reused across calls: its size is bounded by the tile size.
struct PanelBuffer {
  float* panels;
  float* scratch;
};

PanelBuffer panel_buffer(int64_t rows, int64_t k, int panel_rows);

// dst[0:n] = float(src[offset : offset + n]).
void load_row(const void* src, Elem t, int64_t offset, int64_t n, float* dst);

// dst[offset : offset + n] = src[0:n] (+ bias[0:n] when bias is not null) as t.
void store_row(const float* src, const float* bias, int64_t n, void* dst, Elem t, int64_t offset);

// Columns [c0, c1) of the output: the kernels write fp32 into `y` (the output
// itself when it is fp32, else a local buffer), then `finish` adds the bias
// and converts.
struct ColumnBlock {
  float* y;
  int64_t ldy;
  ScratchArray<float> local;
};

ColumnBlock column_block(const LinearIO& io, int64_t n, int64_t c0, int64_t c1);
void finish(const LinearIO& io, int64_t n, const ColumnBlock& b, int64_t c0, int64_t c1);

// Run fn(c0, c1) over [0, n) in blocks of `cols`, on the pool when asked.
void for_columns(int64_t n, int64_t cols, bool parallel,
                 const std::function<void(int64_t, int64_t)>& fn);

// Columns per work item: enough items for every thread, aligned to `align`.
int64_t item_columns(int64_t n, int64_t align, bool parallel);

// fn(i, c0, c1) over the columns of every matrix ws[0 .. count) as one pool
// job (items of item_columns(all columns, align) each): small matrices, a GQA
// model's k/v, share the threads with the large ones.
void for_matrix_columns(const QuantMatrix* ws, int count, int64_t align,
                        const std::function<void(int, int64_t, int64_t)>& fn);

// An empty dot product (k == 0): the output is the bias (or 0).
void zero_k(const LinearIO& io, int64_t n);

// Products sharing one x: same x pointer, type, rows, k, bits and group size.
bool share_x(const QuantMatrix* ws, const LinearIO* ios, int count);

} // namespace vllm_metal::cpu::driver
