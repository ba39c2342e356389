// The subset of Metal 4's tensor API and MetalPerformancePrimitives'
// mpp::tensor_ops that vllm-metal's kernels use, emulated on the CPU harness.
//
// Written from the public descriptions of the API (Apple's MPP headers as
// quoted by open kernels), not from Apple's implementation:
//   - metal::tensor<T, dextents<int, 2>, tensor_inline>(ptr, extents[, strides]):
//     a view of memory; extent(0) is the contiguous x (column) dimension,
//     extent(1) the row; strides {1, row pitch}.
//   - mpp::tensor_ops::matmul2d_descriptor(m, n, k, transpose_left,
//     transpose_right, relaxed_precision, mode): C (m x n) = A (m x k) B (k x n),
//     overwritten (multiply) or added to (multiply_accumulate). The left operand
//     is stored m rows of k (k rows of m with transpose_left); the right one k rows
//     of n (n rows of k with transpose_right).
//   - matmul2d<descriptor, metal::execution_simdgroup>: run(left, right, dest) by
//     every thread of one simdgroup; get_destination_cooperative_tensor<...>().
//   - A cooperative tensor: the destination spread over the simdgroup's threads
//     in an implementation-defined layout. A thread owns get_capacity() slots, of
//     which is_valid_element(i) ones hold elements; get_multidimensional_index(i)
//     names slot i's element as {column, row}; store(tensor) writes the valid
//     slots inside the tensor's extents.
//
// What the emulation makes a kernel prove:
//   - no layout assumption: the element each slot holds is a permutation that
//     changes with the harness's lane order (forward, reverse, shuffled), with
//     two invalid slots per thread at order-dependent places; a kernel that
//     assumes a layout computes different (and wrong) results under two orders;
//   - fresh storage is NaN, so multiply_accumulate into an unset destination shows;
//   - every lane of the simdgroup enters run (it is a simdgroup collective);
//   - operands cover the descriptor's tile (a smaller view is reported).
// What it cannot prove: Apple's layouts and rounding (products are summed in
// float in k order, with or without relaxed_precision), shape limits the
// hardware has, and speed.
//
// matmul2d_descriptor is a class-type template argument, a C++20 feature (Metal 4
// allows it), so this part of the prelude exists for sources compiled as C++20.
#pragma once

#if __cplusplus >= 202002L

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "msl_simd.h"
#include "msl_types.h"

namespace metal {

inline constexpr size_t dynamic_extent = size_t(-1);

template <class I, size_t Rank>
struct dextents {
  static_assert(Rank == 2, "the harness emulates rank-2 tensors only");
  I e[2];
  constexpr dextents(I x, I y) : e{x, y} {}
  constexpr I extent(size_t i) const { return e[i]; }
  static constexpr size_t rank() { return Rank; }
};

struct tensor_inline {};

template <class T, class Extents, class Layout = tensor_inline>
struct tensor {
  using element_type = T;
  T* data;
  Extents ext;
  long stride[2];
  tensor(T* p, Extents e) : data(p), ext(e), stride{1, long(e.extent(0))} {}
  template <class Strides>
  tensor(T* p, Extents e, Strides s) : data(p), ext(e), stride{long(s[0]), long(s[1])} {}
  Extents extents() const { return ext; }
  // Element (x = column, y = row) of the view.
  T& at(long x, long y) const { return data[x * stride[0] + y * stride[1]]; }
};

template <int N>
struct execution_simdgroups {
  static constexpr int simdgroups = N;
};
using execution_simdgroup = execution_simdgroups<1>;
struct execution_thread {};

template <class T>
using remove_addrspace_t = std::remove_cv_t<T>;

}  // namespace metal

namespace msl_hx {

template <class T>
struct is_tensor_view : std::false_type {};
template <class T, class E, class L>
struct is_tensor_view<metal::tensor<T, E, L>> : std::true_type {};

// The layout: for an m x n tile spread over one simdgroup, lane `lane`'s valid
// slots hold elements perm[lane * per + v] (v = 0 .. per - 1, row-major element
// ids), perm depending on the launch's lane order; two invalid slots interleave.
struct CoopLayout {
  int per = 0;       // valid slots per lane
  int capacity = 0;  // per + 2
  std::vector<int> element;  // [32 * capacity]: row-major element id, or -1
};

inline const CoopLayout& coop_layout(int m, int n, int order) {
  thread_local std::vector<std::pair<long, CoopLayout>> cache;
  const long key = (long(m) << 32) | (long(n) << 8) | long(order);
  for (auto& kv : cache)
    if (kv.first == key) return kv.second;
  CoopLayout l;
  const int total = m * n;
  l.per = total / kSimdWidth;
  l.capacity = l.per + 2;
  std::vector<int> perm(total);
  for (int i = 0; i < total; ++i) perm[i] = i;
  if (order == 0) {  // lane-strided: lane l holds elements l, l + 32, ...
    for (int lane = 0; lane < kSimdWidth; ++lane)
      for (int v = 0; v < l.per; ++v) perm[lane * l.per + v] = lane + kSimdWidth * v;
  } else {  // a fixed shuffle per order
    uint32_t s = 0x9e3779b9u * uint32_t(order) ^ uint32_t(total);
    for (int i = total - 1; i > 0; --i) {
      s = s * 1664525u + 1013904223u;
      std::swap(perm[i], perm[(s >> 8) % uint32_t(i + 1)]);
    }
  }
  l.element.assign(size_t(kSimdWidth) * l.capacity, -1);
  for (int lane = 0; lane < kSimdWidth; ++lane) {
    const int hole1 = (lane * 7 + order * 3) % l.capacity;
    const int hole2 = (hole1 + l.capacity / 2) % l.capacity;
    int v = 0;
    for (int slot = 0; slot < l.capacity; ++slot) {
      if (slot == hole1 || slot == hole2) continue;
      l.element[size_t(lane) * l.capacity + slot] = perm[lane * l.per + v++];
    }
  }
  cache.emplace_back(key, std::move(l));
  return cache.back().second;
}

inline int launch_order() { return tl_worker->launch->order; }

// Reported once per simdgroup (by its first lane in the collective).
inline void tensor_op_error(const char* file, int line, const char* what) {
  if (int(tl_lane->lane) != __builtin_ctz(my_group().active)) return;
  tl_worker->stats[kTensorOpMisuse]++;
  char msg[320];
  std::snprintf(msg, sizeof msg, "%s:%d: %s\n", file, line, what);
  report(tl_worker->launch, msg);
}

// One thread's part of an M x N tile of E.
template <class E, int M, int N>
class cooperative_tensor {
  static_assert((M * N) % kSimdWidth == 0, "the emulated tile must spread evenly over 32 lanes");

 public:
  using element_type = E;
  static constexpr int rows = M, cols = N;

  cooperative_tensor() : layout_(&coop_layout(M, N, launch_order())), lane_(int(tl_lane->lane)) {
    for (int i = 0; i < kCapacity; ++i) slots_[i] = E(NAN);
  }
  static constexpr int kCapacity = M * N / kSimdWidth + 2;
  int get_capacity() const { return layout_->capacity; }
  bool is_valid_element(int i) const { return element(i) >= 0; }
  // {column, row} of slot i's element (a valid slot).
  metal::array<int, 2> get_multidimensional_index(int i) const {
    const int e = element(i);
    metal::array<int, 2> idx;
    idx[0] = e < 0 ? 0 : e % N;
    idx[1] = e < 0 ? 0 : e / N;
    return idx;
  }
  E& operator[](int i) { return slots_[i]; }
  const E& operator[](int i) const { return slots_[i]; }

  // The valid slots whose element lies inside the view's extents.
  template <class T, class X, class L>
  void store(const metal::tensor<T, X, L>& t) const {
    for (int i = 0; i < kCapacity; ++i) {
      const int e = element(i);
      if (e < 0) continue;
      const long x = e % N, y = e / N;
      if (x < long(t.ext.extent(0)) && y < long(t.ext.extent(1)))
        t.at(x, y) = std::remove_cv_t<T>(slots_[i]);
    }
  }
  // The valid slots from the view (0 outside its extents).
  template <class T, class X, class L>
  void load(const metal::tensor<T, X, L>& t) {
    for (int i = 0; i < kCapacity; ++i) {
      const int e = element(i);
      if (e < 0) continue;
      const long x = e % N, y = e / N;
      slots_[i] = x < long(t.ext.extent(0)) && y < long(t.ext.extent(1)) ? E(float(t.at(x, y))) : E(0);
    }
  }

 private:
  int element(int i) const {
    return i >= 0 && i < layout_->capacity ? layout_->element[size_t(lane_) * layout_->capacity + i] : -1;
  }
  const CoopLayout* layout_;
  int lane_;
  E slots_[kCapacity];
};

}  // namespace msl_hx

namespace mpp::tensor_ops {

struct matmul2d_descriptor {
  enum class mode { multiply, multiply_accumulate };
  int m, n, k;
  bool transpose_left, transpose_right, relaxed_precision;
  mode matmul_mode;
  constexpr matmul2d_descriptor(int m_, int n_, int k_ = int(metal::dynamic_extent), bool tl = false,
                                bool tr = false, bool relaxed = false, mode md = mode::multiply)
      : m(m_), n(n_), k(k_), transpose_left(tl), transpose_right(tr), relaxed_precision(relaxed),
        matmul_mode(md) {}
};

template <matmul2d_descriptor D, class Scope>
class matmul2d {
  static_assert(std::is_same_v<Scope, metal::execution_simdgroup>,
                "the harness emulates matmul2d run by one simdgroup (metal::execution_simdgroup)");

 public:
  template <class Left, class Right, class Elem>
  msl_hx::cooperative_tensor<Elem, D.m, D.n> get_destination_cooperative_tensor() const {
    return {};
  }

  template <class Left, class Right, class Elem, int M, int N>
  void run(const Left& left, const Right& right, msl_hx::cooperative_tensor<Elem, M, N>& dest,
           const char* msl_file = __builtin_FILE(), int msl_line = __builtin_LINE()) const {
    static_assert(M == D.m && N == D.n, "the destination is not this descriptor's m x n tile");
    static_assert(msl_hx::is_tensor_view<Left>::value && msl_hx::is_tensor_view<Right>::value,
                  "the harness emulates memory (tensor view) left and right operands");
    // Every thread of the simdgroup enters run: a simdgroup collective.
    msl_hx::deposit(0);
    msl_hx::arrive(msl_file, msl_line, 20);
    const int k = D.k == int(metal::dynamic_extent)
        ? int(D.transpose_left ? left.ext.extent(1) : left.ext.extent(0))
        : D.k;
    // Stored shapes (x extent, y extent) the tile needs.
    const long lx = D.transpose_left ? D.m : k, ly = D.transpose_left ? k : D.m;
    const long rx = D.transpose_right ? k : D.n, ry = D.transpose_right ? D.n : k;
    if (long(left.ext.extent(0)) < lx || long(left.ext.extent(1)) < ly) {
      msl_hx::tensor_op_error(msl_file, msl_line, "matmul2d: the left operand's extents are smaller than its tile");
      return;
    }
    if (long(right.ext.extent(0)) < rx || long(right.ext.extent(1)) < ry) {
      msl_hx::tensor_op_error(msl_file, msl_line, "matmul2d: the right operand's extents are smaller than its tile");
      return;
    }
    const bool accumulate = D.matmul_mode == matmul2d_descriptor::mode::multiply_accumulate;
    for (int i = 0; i < dest.get_capacity(); ++i) {
      if (!dest.is_valid_element(i)) continue;
      const metal::array<int, 2> idx = dest.get_multidimensional_index(i);
      const long c = idx[0], r = idx[1];
      float s = 0.0f;
      for (long j = 0; j < k; ++j) {
        const float a = float(D.transpose_left ? left.at(r, j) : left.at(j, r));
        const float b = float(D.transpose_right ? right.at(j, c) : right.at(c, j));
        s += a * b;
      }
      dest[i] = Elem(accumulate ? float(dest[i]) + s : s);
    }
  }
};

}  // namespace mpp::tensor_ops

#endif  // __cplusplus >= 202002L
