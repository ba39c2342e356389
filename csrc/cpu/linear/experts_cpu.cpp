#include "cpu/linear/experts_cpu.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/linear/linear_driver.h"
#include "cpu/linear/linear_kernels.h"
#include "cpu/linear/linear_q8.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu {

using namespace driver;

namespace {

int64_t elem_bytes(Elem t) {
  return t == Elem::F32 ? 4 : 2;
}

// Expert e's matrix inside the stack.
QuantMatrix expert_quant(const QuantMatrix& q, int64_t e) {
  QuantMatrix m = q;
  const int64_t groups = q.n * (q.k / q.group_size);
  m.w = q.w + e * (q.n * q.k * q.bits / 32);
  const int64_t scale_bytes = q.mxfp4 ? 1 : elem_bytes(q.scale_type);
  m.scales = static_cast<const char*>(q.scales) + e * groups * scale_bytes;
  if (q.biases != nullptr) {
    m.biases = static_cast<const char*>(q.biases) + e * groups * scale_bytes;
  }
  return m;
}

DenseMatrix expert_dense(const DenseMatrix& d, int64_t e) {
  DenseMatrix m = d;
  m.w = static_cast<const char*>(d.w) + e * d.n * d.k * elem_bytes(d.type);
  return m;
}

// The pairs of one expert: positions [begin, begin + count) of the sorted order.
struct Group {
  int64_t expert;
  int64_t begin;
  int64_t count;
};

// Pairs stably sorted by expert, and the runs of each touched expert.
struct Sorted {
  std::vector<int32_t> order;  // pair at each sorted position
  std::vector<int32_t> rows;   // its row of x
  std::vector<Group> groups;
};

Sorted sort_pairs(const ExpertIO& io, int64_t experts) {
  Sorted s;
  std::vector<int64_t> start(experts + 1, 0);
  for (int64_t p = 0; p < io.pairs; ++p) {
    const int32_t e = io.idx[p];
    if (e < 0 || e >= experts) {
      throw std::out_of_range("expert_matmul: expert index " + std::to_string(e) + " at pair " +
                              std::to_string(p) + " is outside [0, " + std::to_string(experts) +
                              ")");
    }
    ++start[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) {
    if (start[e + 1] > 0) s.groups.push_back({e, start[e], start[e + 1]});
    start[e + 1] += start[e];
  }
  s.order.resize(io.pairs);
  s.rows.resize(io.pairs);
  for (int64_t p = 0; p < io.pairs; ++p) {
    const int64_t at = start[io.idx[p]]++;
    s.order[at] = static_cast<int32_t>(p);
    s.rows[at] = static_cast<int32_t>(p / io.pairs_per_row);
  }
  return s;
}

struct Item {
  int group;
  int64_t c0, c1;
};

} // namespace

void expert_matmul_cpu(const ExpertStack& w, const ExpertIO& io) {
  const int64_t n = w.quantized ? w.q.n : w.d.n;
  const int64_t k = w.quantized ? w.q.k : w.d.k;
  if (io.pairs == 0 || n == 0) return;
  if (io.pairs_per_row < 1 || io.pairs % io.pairs_per_row != 0) {
    throw std::invalid_argument("expert_matmul: pairs must be a multiple of pairs_per_row");
  }
  const Sorted s = sort_pairs(io, w.experts);
  const bool int8 = io.int8_activations && w.quantized && !w.q.mxfp4 && k > 0;
  if (w.quantized && w.q.tiled && !int8) {
    throw std::invalid_argument("expert_matmul: tiled experts need int8 activations");
  }
  const bool nibble = w.quantized && w.q.bits == 4 && !int8;
  // Group sums of x serve the affine biases; MXFP4 has none (int8 forms its own).
  const int gs = w.quantized && !w.q.mxfp4 && !int8 ? w.q.group_size : 0;
  LinearIO gathered{io.x, io.x_type, io.pairs, nullptr, Elem::F32, nullptr, Elem::F32};
  const PreparedX px = k > 0 ? prepare_x(gathered, k, nibble, gs, s.rows.data()) : PreparedX{};
  // The sorted pairs' rows, each rounded once.
  const Q8Acts acts = int8 ? quantize_acts({px.x, Elem::F32, io.pairs, nullptr, Elem::F32,
                                            nullptr, Elem::F32},
                                           k, w.q.bits, w.q.group_size)
                           : Q8Acts{};
  const LinearKernels& kern = linear_kernels();
  // Small experts (MLA's per-head products) take the GEMM at every count
  // (kInvariantMaxCols); not MXFP4's, whose fp32 panels overflow where the
  // GEMV's scale-after-sum does not.
  const bool invariant = n <= kInvariantMaxCols && !(w.quantized && w.q.mxfp4);
  const int64_t gemv_max = invariant ? 0
                           : w.quantized          ? kQuantGemvMaxRows
                                                  : kDenseGemvMaxRows;
  const int64_t expert_bytes = w.quantized ? n * k * w.q.bits / 8 : n * k * elem_bytes(w.d.type);

  int64_t traffic = 0, gemv_columns = 0;
  for (const Group& g : s.groups) {
    traffic += expert_bytes * (g.count > gemv_max ? g.count : 1);
    if (g.count <= gemv_max) gemv_columns += n;
  }
  const bool parallel = traffic >= kSerialBytes;
  const int64_t gemv_cols = item_columns(std::max<int64_t>(gemv_columns, 1), 8, parallel);
  const int64_t gemm_cols = tile_rows(n, k, parallel, kern.panel_rows);
  const int64_t int8_cols = item_columns(n, kQ8TileCols, parallel);
  std::vector<Item> items;
  for (int gi = 0; gi < static_cast<int>(s.groups.size()); ++gi) {
    const int64_t cols = int8                              ? int8_cols
                         : s.groups[gi].count <= gemv_max ? std::min(gemv_cols, n)
                                                           : gemm_cols;
    for (int64_t c0 = 0; c0 < n; c0 += cols) items.push_back({gi, c0, std::min(n, c0 + cols)});
  }

  const int64_t groups_per_row = gs > 0 ? k / gs : 0;
  auto run = [&](int it) {
    const Item& item = items[it];
    const Group& g = s.groups[item.group];
    const int64_t c0 = item.c0, c1 = item.c1, ldy = c1 - c0;
    ScratchArray<float> y = scratch_array<float>(g.count * ldy);
    if (k == 0) {
      std::fill(y.get(), y.get() + g.count * ldy, 0.0f);
    } else if (int8) {
      q8_products(expert_quant(w.q, g.expert), acts, g.begin, g.begin + g.count, c0, c1, y.get(),
                  ldy);
    } else if (g.count <= gemv_max) {
      const QuantMatrix q = w.quantized ? expert_quant(w.q, g.expert) : QuantMatrix{};
      const DenseMatrix d = w.quantized ? DenseMatrix{} : expert_dense(w.d, g.expert);
      const int64_t sub = g.count > kGemvRows ? kGemvSubCols : ldy;
      for (int64_t s0 = c0; s0 < c1; s0 += sub) {
        const int64_t s1 = std::min(c1, s0 + sub);
        for (int64_t i = 0; i < g.count; i += kGemvRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kGemvRows, g.count - i));
          const float* x = px.x + (g.begin + i) * k;
          float* out = y.get() + i * ldy + (s0 - c0);
          if (w.quantized) {
            const float* xsum =
                px.xsum ? px.xsum.get() + (g.begin + i) * groups_per_row : nullptr;
            kern.quant_gemv(q, x, xsum, mr, s0, s1, out, ldy);
          } else {
            kern.dense_gemv(d, x, mr, s0, s1, out, ldy);
          }
        }
      }
    } else {
      PanelBuffer buf = panel_buffer(ldy, k, kern.panel_rows);
      if (w.quantized) {
        kern.quant_panels(expert_quant(w.q, g.expert), c0, ldy, buf.panels, buf.scratch);
      } else {
        kern.dense_panels(expert_dense(w.d, g.expert), c0, ldy, buf.panels, buf.scratch);
      }
      kern.gemm(px.x + g.begin * k, g.count, buf.panels, ldy, k, y.get(), ldy);
    }
    std::vector<float> bias;
    if (io.bias != nullptr) {
      bias.resize(ldy);
      load_row(io.bias, io.bias_type, g.expert * n + c0, ldy, bias.data());
    }
    for (int64_t i = 0; i < g.count; ++i) {
      const int64_t pair = s.order[g.begin + i];
      store_row(y.get() + i * ldy, bias.empty() ? nullptr : bias.data(), ldy, io.out,
                io.out_type, pair * n + c0);
    }
  };
  if (!parallel || items.size() <= 1) {
    for (int it = 0; it < static_cast<int>(items.size()); ++it) run(it);
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(items.size()), run);
}

} // namespace vllm_metal::cpu
