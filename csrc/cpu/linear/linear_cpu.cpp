#include "cpu/linear/linear_cpu.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "cpu/linear/linear_driver.h"
#include "cpu/linear/linear_kernels.h"
#include "cpu/linear/linear_q8.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

using namespace driver;

namespace {

// Up to this many rows of x, weights are decoded in registers per chunk of
// rows (GEMV); above it fp32 panels of W are decoded once and reused (GEMM).
// Crossovers measured on Zen 4 (AVX-512) at SmolLM2's shapes.
constexpr int64_t kQuantGemvMaxRows = 12;
constexpr int64_t kDenseGemvMaxRows = 12;
// Rows of x per GEMV call (one weight decode serves them all).
constexpr int kGemvRows = 4;
// Columns per GEMV sub-range when x has several chunks of rows: the
// sub-range's weights stay in L1 from one chunk to the next.
constexpr int64_t kGemvSubCols = 16;
// fp32 weight panels of one GEMM tile, sized to sit in L2.
constexpr int64_t kTileFloats = 48 * 1024;


// x as fp32 rows [m, k]: the input itself when it already is, else a copy
// (in nibble order when `nibble`). xsum [m, k / gs] gets each group's sum.
struct PreparedX {
  const float* x = nullptr;
  ScratchArray<float> owned;
  ScratchArray<float> xsum;
};

PreparedX prepare_x(const LinearIO& io, int64_t k, bool nibble, int gs) {
  PreparedX p;
  const bool copy = nibble || io.x_type != Elem::F32;
  if (!copy && gs == 0) {
    p.x = static_cast<const float*>(io.x);
    return p;
  }
  std::unique_ptr<float[]> row(new float[k]);
  if (copy) p.owned = scratch_array<float>(io.m * k);
  const int64_t groups = gs > 0 ? k / gs : 0;
  if (gs > 0) p.xsum = scratch_array<float>(io.m * groups);
  for (int64_t i = 0; i < io.m; ++i) {
    load_row(io.x, io.x_type, i * k, k, row.get());
    if (copy) {
      float* dst = p.owned.get() + i * k;
      if (nibble) {
        for (int64_t b = 0; b < k; b += kNibbleBlock) {
          for (int j = 0; j < kNibbleBlock / 2; ++j) {
            dst[b + j] = row[b + 2 * j];
            dst[b + kNibbleBlock / 2 + j] = row[b + 2 * j + 1];
          }
        }
      } else {
        std::copy(row.get(), row.get() + k, dst);
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int64_t c = 0; c < gs; ++c) s += row[g * gs + c];
      p.xsum[i * groups + g] = s;
    }
  }
  p.x = copy ? p.owned.get() : static_cast<const float*>(io.x);
  return p;
}

// GEMM tile rows: an L2-sized fp32 tile of whole panel pairs, but no more
// than one item's share.
int64_t tile_rows(int64_t n, int64_t k, bool parallel, int panel_rows) {
  const int64_t pair = 2 * panel_rows;
  int64_t rows = std::max(pair, (kTileFloats / std::max<int64_t>(k, 1)) / pair * pair);
  if (parallel) rows = std::min(rows, item_columns(n, pair, true));
  return rows;
}

// Per-thread panel buffer for `rows` rows of k (plus one panel of scratch),
// reused across calls: its size is bounded by the tile size.
struct PanelBuffer {
  float* panels;
  float* scratch;
};

PanelBuffer panel_buffer(int64_t rows, int64_t k, int panel_rows) {
  thread_local ScratchVector<float> buf;
  const int64_t panel_floats = round_up(rows, panel_rows) * k;
  const int64_t floats = panel_floats + panel_rows * k;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return {buf.data(), buf.data() + panel_floats};
}

// Output columns [c0, c1) of a quantized GEMV (m <= kQuantGemvMaxRows).
void quant_gemv_columns(const LinearKernels& kern, const QuantMatrix& w, const LinearIO& io,
                        const PreparedX& px, int64_t c0, int64_t c1) {
  const int64_t n = w.n, k = w.k, m = io.m;
  const int64_t groups = k / w.group_size;
  const int64_t sub = m > kGemvRows ? kGemvSubCols : n;
  ColumnBlock b = column_block(io, n, c0, c1);
  for (int64_t s0 = c0; s0 < c1; s0 += sub) {
    const int64_t s1 = std::min(c1, s0 + sub);
    for (int64_t i = 0; i < m; i += kGemvRows) {
      const int mr = static_cast<int>(std::min<int64_t>(kGemvRows, m - i));
      kern.quant_gemv(w, px.x + i * k, px.xsum.get() + i * groups, mr, s0, s1,
                      b.y + i * b.ldy + (s0 - c0), b.ldy);
    }
  }
  finish(io, n, b, c0, c1);
}

} // namespace

void quantized_matmul_cpu(const QuantMatrix& w, const LinearIO& io) {
  const int64_t n = w.n, k = w.k, m = io.m;
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_k(io, n);
  if (io.int8_activations) return quantized_matmul_q8_cpu(w, io);
  if (w.biases == nullptr) throw std::invalid_argument("null biases need int8 activations");
  const LinearKernels& kern = linear_kernels();
  const int64_t weight_bytes = n * k * w.bits / 8;

  if (m > kQuantGemvMaxRows) {
    const bool parallel = weight_bytes * m >= kSerialBytes;
    PreparedX px = prepare_x(io, k, w.bits == 4, 0);
    const int pr = kern.panel_rows;
    for_columns(n, tile_rows(n, k, parallel, pr), parallel, [&](int64_t c0, int64_t c1) {
      ColumnBlock b = column_block(io, n, c0, c1);
      PanelBuffer buf = panel_buffer(c1 - c0, k, pr);
      kern.quant_panels(w, c0, c1 - c0, buf.panels, buf.scratch);
      kern.gemm(px.x, m, buf.panels, c1 - c0, k, b.y, b.ldy);
      finish(io, n, b, c0, c1);
    });
    return;
  }

  // GEMV: each chunk of rows of x meets the weights of a sub-range while they
  // are in L1, so the weights come from memory once.
  const bool parallel = weight_bytes >= kSerialBytes;
  PreparedX px = prepare_x(io, k, w.bits == 4, w.group_size);
  for_columns(n, item_columns(n, 8, parallel), parallel, [&](int64_t c0, int64_t c1) {
    quant_gemv_columns(kern, w, io, px, c0, c1);
  });
}

void quantized_matmuls_cpu(const QuantMatrix* ws, const LinearIO* ios, int count) {
  if (count > 0 && ios[0].int8_activations) return quantized_matmuls_q8_cpu(ws, ios, count);
  const bool shared = share_x(ws, ios, count) && ios[0].m <= kQuantGemvMaxRows;
  if (!shared) {
    for (int i = 0; i < count; ++i) quantized_matmul_cpu(ws[i], ios[i]);
    return;
  }
  // x is prepared once for every matrix.
  const LinearKernels& kern = linear_kernels();
  PreparedX px = prepare_x(ios[0], ws[0].k, ws[0].bits == 4, ws[0].group_size);
  for_matrix_columns(ws, count, 8, [&](int i, int64_t c0, int64_t c1) {
    quant_gemv_columns(kern, ws[i], ios[i], px, c0, c1);
  });
}

void dense_matmul_cpu(const DenseMatrix& w, const LinearIO& io) {
  const int64_t n = w.n, k = w.k, m = io.m;
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_k(io, n);
  const LinearKernels& kern = linear_kernels();
  const bool gemv = m <= kDenseGemvMaxRows;
  PreparedX px = prepare_x(io, k, false, 0);
  const int64_t weight_bytes = n * k * (w.type == Elem::F32 ? 4 : 2);
  const bool parallel = weight_bytes * (gemv ? 1 : m) >= kSerialBytes;

  if (gemv) {
    const int64_t sub = m > kGemvRows ? kGemvSubCols : n;
    for_columns(n, item_columns(n, 8, parallel), parallel, [&](int64_t c0, int64_t c1) {
      ColumnBlock b = column_block(io, n, c0, c1);
      for (int64_t s0 = c0; s0 < c1; s0 += sub) {
        const int64_t s1 = std::min(c1, s0 + sub);
        for (int64_t i = 0; i < m; i += kGemvRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kGemvRows, m - i));
          kern.dense_gemv(w, px.x + i * k, mr, s0, s1, b.y + i * b.ldy + (s0 - c0), b.ldy);
        }
      }
      finish(io, n, b, c0, c1);
    });
    return;
  }
  const int pr = kern.panel_rows;
  for_columns(n, tile_rows(n, k, parallel, pr), parallel, [&](int64_t c0, int64_t c1) {
    ColumnBlock b = column_block(io, n, c0, c1);
    PanelBuffer buf = panel_buffer(c1 - c0, k, pr);
    kern.dense_panels(w, c0, c1 - c0, buf.panels, buf.scratch);
    kern.gemm(px.x, m, buf.panels, c1 - c0, k, b.y, b.ldy);
    finish(io, n, b, c0, c1);
  });
}

} // namespace vllm_metal::cpu
