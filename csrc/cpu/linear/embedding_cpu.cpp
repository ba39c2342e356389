#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "cpu/linear/linear_cpu.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

// Rows per work item once a gather is big enough to be worth the pool.
constexpr int64_t kRowsPerItem = 64;

// Check every id before writing anything, so a bad batch fails cleanly.
void check_ids(const int32_t* ids, int64_t t, int64_t n) {
  for (int64_t i = 0; i < t; ++i) {
    if (ids[i] < 0 || ids[i] >= n) {
      throw std::out_of_range(
          "embedding_gather: ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
          " is outside the table's " + std::to_string(n) + " rows");
    }
  }
}

template <typename F>
void for_rows(int64_t t, F&& fn) {
  const int64_t items = (t + kRowsPerItem - 1) / kRowsPerItem;
  auto run = [&](int item) {
    const int64_t end = std::min(t, (item + 1) * kRowsPerItem);
    for (int64_t i = item * kRowsPerItem; i < end; ++i) fn(i);
  };
  if (items <= 1) {
    if (items == 1) run(0);
    return;
  }
  ThreadPool::instance().parallel_for(static_cast<int>(items), run);
}

template <typename S>
float scale_at(const void* p, int64_t i) {
  return S::to_float(static_cast<const typename S::storage*>(p)[i]);
}

// dst[0:k] = row r of the quantized table, in natural column order.
template <typename S>
void dequant_row(const QuantMatrix& q, int64_t r, float* dst) {
  const int per_word = 32 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1u;
  const int64_t words = q.k / per_word;
  const int64_t groups = q.k / q.group_size;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t sg = quant_offset(q.tiled, q.n, groups, r, g);
    const float s = scale_at<S>(q.scales, sg);
    const float b = scale_at<S>(q.biases, sg);
    const int64_t w0 = g * q.group_size / per_word;
    const int64_t w1 = w0 + q.group_size / per_word;
    for (int64_t j = w0; j < w1; ++j) {
      const uint32_t word = q.w[quant_offset(q.tiled, q.n, words, r, j)];
      for (int e = 0; e < per_word; ++e) {
        dst[j * per_word + e] = s * static_cast<float>((word >> (e * q.bits)) & mask) + b;
      }
    }
  }
}

template <typename T>
void store(const float* src, int64_t n, void* dst, int64_t offset) {
  auto* out = static_cast<typename T::storage*>(dst) + offset;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = T::from_float(src[i]);
}

} // namespace

void embedding_gather_dense_cpu(const DenseMatrix& table, const int32_t* ids, int64_t t,
                                void* out) {
  check_ids(ids, t, table.n);
  const size_t row_bytes = static_cast<size_t>(table.k) * (table.type == Elem::F32 ? 4 : 2);
  const char* src = static_cast<const char*>(table.w);
  char* dst = static_cast<char*>(out);
  for_rows(t, [&](int64_t i) {
    std::memcpy(dst + i * row_bytes, src + static_cast<int64_t>(ids[i]) * row_bytes, row_bytes);
  });
}

void embedding_gather_quant_cpu(const QuantMatrix& table, const int32_t* ids, int64_t t,
                                void* out, Elem out_type) {
  check_ids(ids, t, table.n);
  const int64_t k = table.k;
  for_rows(t, [&](int64_t i) {
    std::unique_ptr<float[]> row(new float[k]);
    switch (table.scale_type) {
      case Elem::F32:
        dequant_row<F32>(table, ids[i], row.get());
        break;
      case Elem::BF16:
        dequant_row<BF16>(table, ids[i], row.get());
        break;
      default:
        dequant_row<F16>(table, ids[i], row.get());
    }
    switch (out_type) {
      case Elem::F32:
        return store<F32>(row.get(), k, out, i * k);
      case Elem::BF16:
        return store<BF16>(row.get(), k, out, i * k);
      default:
        return store<F16>(row.get(), k, out, i * k);
    }
  });
}

} // namespace vllm_metal::cpu
