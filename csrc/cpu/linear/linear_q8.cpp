#include "cpu/linear/linear_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/runtime/isa.h"
#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

using namespace driver;

namespace {

// Rows of x quantized per pool item.
constexpr int64_t kQuantizeRows = 16;


// --- portable kernels: the same arithmetic, one element at a time --------

void quantize_row_generic(const float* x, int64_t k, int64_t kp, int bits, int group_size,
                          int8_t* q, float* d, float* xsum) {
  std::fill(q, q + kp, int8_t{0});
  for (int64_t b = 0; b < kp / kQ8Block; ++b) {
    float amax = 0.0f;
    const int64_t c0 = b * kQ8Block, c1 = std::min(k, c0 + kQ8Block);
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[c]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    for (int64_t c = c0; c < c1; ++c) {
      // Nearest even, as the SIMD kernel; a non-finite x leaves the code 0
      // (its block's step is then inf or nan, and so is the output).
      const float v = x[c] * inv;
      q[q8_position(c, bits)] =
          std::isfinite(v) ? static_cast<int8_t>(std::nearbyint(std::clamp(v, -127.0f, 127.0f)))
                           : int8_t{0};
    }
  }
  for (int64_t g = 0; g < k / group_size; ++g) {
    float s = 0.0f;
    for (int64_t c = 0; c < group_size; ++c) s += x[g * group_size + c];
    xsum[g] = s;
  }
}

// Integer dot product of code row n with quantized row i over block b. Both
// operands are read in runs (a 4-bit block's 16 bytes meet its even columns'
// activations with their low nibbles and the odd columns' with the high ones,
// q8_position's order), so the compiler vectorizes it: this is what every CPU
// without VNNI (AVX2 hosts) decodes int8 activations with.
int32_t block_dot(const QuantMatrix& w, const Q8Acts& a, int64_t i, int64_t n, int64_t b) {
  const auto* row = reinterpret_cast<const uint8_t*>(w.w) + n * (w.k * w.bits / 8);
  const int8_t* qa = a.q.get() + i * a.kp;
  const int64_t c0 = b * kQ8Block;
  int32_t s = 0;
  if (w.bits == 4) {
    const uint8_t* bytes = row + c0 / 2;
    const int8_t* even = qa + q8_position(c0, 4);
    const int8_t* odd = qa + q8_position(c0 + 1, 4);
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < kQ8Block / 2; ++j) {
      s += (bytes[j] & 15) * even[j] + (bytes[j] >> 4) * odd[j];
    }
  } else {
    const uint8_t* codes = row + c0;
    const int8_t* q = qa + c0;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < kQ8Block; ++j) s += codes[j] * q[j];
  }
  return s;
}

template <typename S>
float output_generic(const QuantMatrix& w, const Q8Acts& a, int64_t i, int64_t n) {
  const int64_t groups = w.k / w.group_size;
  const int64_t per = w.group_size / kQ8Block;
  const auto* scales = static_cast<const typename S::storage*>(w.scales) + n * groups;
  const auto* biases =
      w.biases ? static_cast<const typename S::storage*>(w.biases) + n * groups : nullptr;
  const float* d = a.d.get() + i * (a.kp / kQ8Block);
  const float* xsum = a.xsum.get() + i * groups;
  float y = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    float t = 0.0f;
    for (int64_t b = g * per; b < (g + 1) * per; ++b) {
      t += static_cast<float>(block_dot(w, a, i, n, b)) * d[b];
    }
    const float scale = S::to_float(scales[g]);
    const float bias = biases ? S::to_float(biases[g]) : -w.zero_point * scale;
    y += scale * t + bias * xsum[g];
  }
  return y;
}

// Outputs [c0, c1) of rows [r0, r1) of a, from rows c0 .. of w in MLX's layout.
void outputs_generic(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1, float* y, int64_t ldy) {
  for_types(w.scale_type, [&](auto type) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t n = c0; n < c1; ++n)
        y[(i - r0) * ldy + (n - c0)] = output_generic<decltype(type)>(w, a, i, n);
  });
}

// Rows [r0, r0 + h) of a tiled w (one tile) copied into MLX's layout in scratch.
QuantMatrix untile(const QuantMatrix& w, int64_t r0, int64_t h, void* scratch) {
  const int64_t words = w.k * w.bits / 32, groups = w.k / w.group_size;
  const size_t elem = w.scale_type == Elem::F32 ? 4 : 2;
  auto* codes = static_cast<uint32_t*>(scratch);
  auto* scales = reinterpret_cast<char*>(codes + words * kQ8TileCols);
  char* biases = w.biases ? scales + groups * kQ8TileCols * elem : nullptr;
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t j = 0; j < words; ++j) {
      codes[r * words + j] = w.w[quant_offset(true, w.n, words, r0 + r, j)];
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = quant_offset(true, w.n, groups, r0 + r, g);
      std::memcpy(scales + (r * groups + g) * elem, static_cast<const char*>(w.scales) + at * elem,
                  elem);
      if (biases) {
        std::memcpy(biases + (r * groups + g) * elem,
                    static_cast<const char*>(w.biases) + at * elem, elem);
      }
    }
  }
  QuantMatrix rows = w;
  rows.w = codes;
  rows.scales = scales;
  rows.biases = biases;
  rows.n = h;
  rows.tiled = false;
  return rows;
}

// The portable kernel computes each output alone (output_generic), so it is
// batch-invariant as it stands; a tiled w is read one tile at a time.
void gemm_generic(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
                  int64_t n1, float* y, int64_t ldy, void* scratch) {
  if (!w.tiled) return outputs_generic(w, a, r0, r1, n0, n1, y, ldy);
  for (int64_t t0 = n0; t0 < n1; t0 += kQ8TileCols) {
    const QuantMatrix rows = untile(w, t0, std::min<int64_t>(kQ8TileCols, w.n - t0), scratch);
    outputs_generic(rows, a, r0, r1, 0, std::min<int64_t>(kQ8TileCols, n1 - t0), y + (t0 - n0),
                    ldy);
  }
}

const Q8Kernels kGeneric = {quantize_row_generic, gemm_generic};

// --- drivers -------------------------------------------------------------

// Output columns [c0, c1) for every row of x.
void q8_columns(const QuantMatrix& w, const LinearIO& io, const Q8Acts& a, int64_t c0,
                int64_t c1) {
  ColumnBlock b = column_block(io, w.n, c0, c1);
  q8_products(w, a, 0, a.m, c0, c1, b.y, b.ldy);
  finish(io, w.n, b, c0, c1);
}

} // namespace

void q8_products(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
                 int64_t n1, float* y, int64_t ldy) {
  thread_local std::vector<uint8_t> scratch;
  const auto bytes = static_cast<size_t>(q8_tile_scratch(w));
  if (scratch.size() < bytes) scratch.resize(bytes);
  q8_kernels().gemm(w, a, r0, r1, n0, n1, y, ldy, scratch.data());
}

int64_t q8_tile_scratch(const QuantMatrix& w) {
  const int64_t words = w.k * w.bits / 32;
  const int64_t groups = w.k / w.group_size;
  return (words + 2 * groups) * kQ8TileCols * 4;
}

const Q8Kernels& q8_kernels_generic() {
  return kGeneric;
}

const Q8Kernels& q8_kernels() {
#if VLLM_METAL_X86_DISPATCH
  if (active_isa() == Isa::Avx512) {
    if (const Q8Kernels* k = q8_kernels_vnni()) return *k;
  }
#endif
  return kGeneric;
}

Q8Acts quantize_acts(const LinearIO& io, int64_t k, int bits, int group_size) {
  Q8Acts a;
  a.m = io.m;
  a.k = k;
  a.bits = bits;
  a.group_size = group_size;
  a.kp = round_up(k, bits == 4 ? kChunk4 : kChunk8);
  a.q = scratch_array<int8_t>(a.m * a.kp);
  a.d = scratch_array<float>(a.m * (a.kp / kQ8Block));
  a.xsum = scratch_array<float>(a.m * (k / group_size));
  const Q8Kernels& kern = q8_kernels();
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(io.x_type == Elem::F32 ? 0 : k);
    for (int64_t i = r0; i < r1; ++i) {
      const float* x = static_cast<const float*>(io.x) + i * k;
      if (io.x_type != Elem::F32) {
        load_row(io.x, io.x_type, i * k, k, row.data());
        x = row.data();
      }
      kern.quantize_row(x, k, a.kp, bits, group_size, a.q.get() + i * a.kp,
                        a.d.get() + i * (a.kp / kQ8Block),
                        a.xsum.get() + i * (k / group_size));
    }
  };
  const int64_t items = ceil_div(a.m, kQuantizeRows);
  if (items <= 1) {
    rows(0, a.m);
  } else {
    ThreadPool::instance().parallel_for(static_cast<int>(items), [&](int it) {
      rows(it * kQuantizeRows, std::min(a.m, (it + 1) * kQuantizeRows));
    });
  }
  return a;
}

void quantized_matmul_q8_cpu(const QuantMatrix& w, const LinearIO& io) {
  const int64_t n = w.n, k = w.k, m = io.m;
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_k(io, n);
  const Q8Acts a = quantize_acts(io, k, w.bits, w.group_size);
  const int64_t weight_bytes = n * k * w.bits / 8;
  const bool parallel = weight_bytes * m >= kSerialBytes;
  // Whole tiles per item.
  for_columns(n, item_columns(n, kQ8TileCols, parallel), parallel, [&](int64_t c0, int64_t c1) {
    q8_columns(w, io, a, c0, c1);
  });
}

void quantized_matmuls_q8_cpu(const QuantMatrix* ws, const LinearIO* ios, int count) {
  if (!share_x(ws, ios, count)) {
    for (int i = 0; i < count; ++i) quantized_matmul_cpu(ws[i], ios[i]);
    return;
  }
  // x is quantized once for every matrix.
  const Q8Acts a = quantize_acts(ios[0], ws[0].k, ws[0].bits, ws[0].group_size);
  for_matrix_columns(ws, count, kQ8TileCols, [&](int i, int64_t c0, int64_t c1) {
    q8_columns(ws[i], ios[i], a, c0, c1);
  });
}

} // namespace vllm_metal::cpu
