#include "cpu/linear/linear_driver.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "cpu/linear/linear_kernels.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal::cpu::driver {

namespace {

// Work items per pool thread: a thread that finishes early takes another.
constexpr int64_t kItemsPerThread = 2;
// fp32 weight panels of one GEMM tile, sized to sit in L2.
constexpr int64_t kTileFloats = 48 * 1024;

} // namespace

PreparedX prepare_x(const LinearIO& io, int64_t k, bool nibble, int gs, const int32_t* rows) {
  PreparedX p;
  const bool copy = nibble || io.x_type != Elem::F32 || rows != nullptr;
  if (!copy && gs == 0) {
    p.x = static_cast<const float*>(io.x);
    return p;
  }
  std::unique_ptr<float[]> row(new float[k]);
  if (copy) p.owned = scratch_array<float>(io.m * k);
  const int64_t groups = gs > 0 ? k / gs : 0;
  if (gs > 0) p.xsum = scratch_array<float>(io.m * groups);
  for (int64_t i = 0; i < io.m; ++i) {
    load_row(io.x, io.x_type, (rows != nullptr ? rows[i] : i) * k, k, row.get());
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

int64_t tile_rows(int64_t n, int64_t k, bool parallel, int panel_rows) {
  const int64_t pair = 2 * panel_rows;
  int64_t rows = std::max(pair, (kTileFloats / std::max<int64_t>(k, 1)) / pair * pair);
  if (parallel) rows = std::min(rows, item_columns(n, pair, true));
  return rows;
}

PanelBuffer panel_buffer(int64_t rows, int64_t k, int panel_rows) {
  thread_local ScratchVector<float> buf;
  const int64_t panel_floats = round_up(rows, panel_rows) * k;
  const int64_t floats = panel_floats + panel_rows * k;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return {buf.data(), buf.data() + panel_floats};
}

void store_row(const float* src, const float* bias, int64_t n, void* dst, Elem t, int64_t offset) {
  for_types(t, [&](auto type) {
    using T = decltype(type);
    auto* out = static_cast<typename T::storage*>(dst) + offset;
    if (bias != nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = T::from_float(src[i] + bias[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = T::from_float(src[i]);
    }
  });
}

void load_row(const void* src, Elem t, int64_t offset, int64_t n, float* dst) {
  for_types(t, [&](auto type) {
    using T = decltype(type);
    decode_span<T>(static_cast<const typename T::storage*>(src) + offset, dst, n);
  });
}

ColumnBlock column_block(const LinearIO& io, int64_t n, int64_t c0, int64_t c1) {
  ColumnBlock b;
  if (io.out_type == Elem::F32) {
    b.y = static_cast<float*>(io.out) + c0;
    b.ldy = n;
  } else {
    b.local = scratch_array<float>(io.m * (c1 - c0));
    b.y = b.local.get();
    b.ldy = c1 - c0;
  }
  return b;
}

void finish(const LinearIO& io, int64_t n, const ColumnBlock& b, int64_t c0, int64_t c1) {
  if (io.out_type == Elem::F32 && io.bias == nullptr) return;
  std::unique_ptr<float[]> bias;
  if (io.bias != nullptr) {
    bias.reset(new float[c1 - c0]);
    load_row(io.bias, io.bias_type, c0, c1 - c0, bias.get());
  }
  for (int64_t i = 0; i < io.m; ++i) {
    store_row(b.y + i * b.ldy, bias.get(), c1 - c0, io.out, io.out_type, i * n + c0);
  }
}

void for_columns(int64_t n, int64_t cols, bool parallel,
                 const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t items = ceil_div(n, cols);
  if (!parallel || items <= 1) {
    for (int64_t i = 0; i < items; ++i) fn(i * cols, std::min(n, (i + 1) * cols));
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(items), [&](int i) {
    fn(i * cols, std::min(n, (i + 1) * cols));
  });
}

int64_t item_columns(int64_t n, int64_t align, bool parallel) {
  if (!parallel) return std::max<int64_t>(n, 1);
  const int64_t items = ThreadPool::instance().size() * kItemsPerThread;
  return std::max(align, round_up(ceil_div(n, items), align));
}

void for_matrix_columns(const QuantMatrix* ws, int count, int64_t align,
                        const std::function<void(int, int64_t, int64_t)>& fn) {
  int64_t total_n = 0;
  for (int i = 0; i < count; ++i) total_n += ws[i].n;
  const int64_t cols = item_columns(total_n, align, true);
  struct Item {
    int matrix;
    int64_t c0, c1;
  };
  std::vector<Item> items;
  for (int i = 0; i < count; ++i) {
    for (int64_t c0 = 0; c0 < ws[i].n; c0 += cols) {
      items.push_back({i, c0, std::min(ws[i].n, c0 + cols)});
    }
  }
  ThreadPool::instance().parallel_for(static_cast<int>(items.size()), [&](int it) {
    fn(items[it].matrix, items[it].c0, items[it].c1);
  });
}

void zero_k(const LinearIO& io, int64_t n) {
  ColumnBlock b = column_block(io, n, 0, n);
  for (int64_t i = 0; i < io.m; ++i) std::fill(b.y + i * b.ldy, b.y + i * b.ldy + n, 0.0f);
  finish(io, n, b, 0, n);
}

bool share_x(const QuantMatrix* ws, const LinearIO* ios, int count) {
  bool shared = count > 1 && ios[0].m > 0 && ws[0].k > 0;
  for (int i = 1; i < count && shared; ++i) {
    shared = ws[i].k == ws[0].k && ws[i].bits == ws[0].bits &&
        ws[i].group_size == ws[0].group_size && ios[i].x == ios[0].x &&
        ios[i].x_type == ios[0].x_type && ios[i].m == ios[0].m && ws[i].n > 0 &&
        ios[i].int8_activations == ios[0].int8_activations;
  }
  return shared && ws[0].n > 0;
}

} // namespace vllm_metal::cpu::driver
