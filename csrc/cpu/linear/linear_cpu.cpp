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
  const bool gemv = m <= kDenseGemvMaxRows && n > kInvariantMaxCols;
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
