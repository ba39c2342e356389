// simd_* collectives and barriers with exact SIMD-group semantics.
//
// A collective deposits the lane's value, waits until the scheduler releases
// the lanes that reached the same call site, then computes its result from the
// frozen snapshot. Reductions use a fixed pairwise tree, so every lane gets
// bit-identical results; reading an inactive lane returns NaN (or 0xA5 bytes)
// and is reported.
#pragma once

#include "msl_runtime.h"

namespace msl_hx {

inline SimdGroup& my_group() { return tl_worker->groups[tl_lane->simdgroup]; }

template <class T>
inline void deposit(const T& v) {
  static_assert(sizeof(T) <= kSlotBytes, "value too large for a simd collective");
  std::memcpy(my_group().slots[tl_lane->lane], (const void*)&v, sizeof(T));
}

template <class T>
inline T value_of(int lane) {
  T v;
  std::memcpy((void*)&v, my_group().snapshot[lane], sizeof(T));
  return v;
}

inline bool is_active(int lane) { return lane >= 0 && lane < kSimdWidth && (my_group().active >> lane & 1u); }

template <class T>
inline T poison() {
  T v;
  if constexpr (std::is_floating_point<T>::value || std::is_same<T, half>::value ||
                std::is_same<T, metal::bfloat>::value) {
    v = T(NAN);
  } else if constexpr (metal::is_vec<T>::value) {
    using E = typename T::value_type;
    v = T(poison<E>());
  } else {
    std::memset((void*)&v, 0xa5, sizeof(T));
  }
  return v;
}

template <class T>
inline T lowest() {
  if constexpr (metal::is_vec<T>::value) {
    return T(lowest<typename T::value_type>());
  } else if constexpr (std::is_integral<T>::value) {
    return std::numeric_limits<T>::lowest();
  } else {
    return T(-HUGE_VALF);
  }
}

template <class T>
inline T highest() {
  if constexpr (metal::is_vec<T>::value) {
    return T(highest<typename T::value_type>());
  } else if constexpr (std::is_integral<T>::value) {
    return std::numeric_limits<T>::max();
  } else {
    return T(HUGE_VALF);
  }
}

inline void arrive(const char* file, int line, int kind) { wait_simd(Site{file, line, kind}); }

template <class T>
inline T read_lane(int src, const T& own, const char* file, int line) {
  if (is_active(src)) return value_of<T>(src);
  (void)own;
  tl_worker->stats[kInactiveRead]++;
  char msg[256];
  std::snprintf(msg, sizeof msg, "%s:%d: lane %u read lane %d, which is not active in this collective\n", file, line,
                tl_lane->lane, src);
  report(tl_worker->launch, msg);
  return poison<T>();
}

// Fixed pairwise tree over lanes 0..31; inactive lanes contribute `identity`.
template <class T, class Op>
inline T tree_reduce(const T& v, const T& identity, Op op, const char* file, int line, int kind) {
  deposit(v);
  arrive(file, line, kind);
  T vals[kSimdWidth];
  for (int l = 0; l < kSimdWidth; ++l) vals[l] = is_active(l) ? value_of<T>(l) : identity;
  for (int width = kSimdWidth / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) vals[l] = op(vals[l], vals[l + width]);
  return vals[0];
}

}  // namespace msl_hx

namespace metal {

#define MSL_HX_SITE const char *msl_file = __builtin_FILE(), int msl_line = __builtin_LINE()

template <class T>
inline T simd_shuffle(T v, ushort lane, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 1);
  return msl_hx::read_lane<T>(int(lane), v, msl_file, msl_line);
}
template <class T>
inline T simd_broadcast(T v, ushort lane, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 2);
  return msl_hx::read_lane<T>(int(lane), v, msl_file, msl_line);
}
template <class T>
inline T simd_shuffle_xor(T v, ushort mask, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 3);
  return msl_hx::read_lane<T>(int(msl_hx::tl_lane->lane ^ mask), v, msl_file, msl_line);
}
// Lanes whose source is outside the simdgroup keep their own value.
template <class T>
inline T simd_shuffle_down(T v, ushort delta, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 4);
  const int src = int(msl_hx::tl_lane->lane) + delta;
  return src < msl_hx::kSimdWidth ? msl_hx::read_lane<T>(src, v, msl_file, msl_line) : v;
}
template <class T>
inline T simd_shuffle_up(T v, ushort delta, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 5);
  const int src = int(msl_hx::tl_lane->lane) - delta;
  return src >= 0 ? msl_hx::read_lane<T>(src, v, msl_file, msl_line) : v;
}
template <class T>
inline T simd_shuffle_rotate_down(T v, ushort delta, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 6);
  return msl_hx::read_lane<T>(int((msl_hx::tl_lane->lane + delta) % msl_hx::kSimdWidth), v, msl_file, msl_line);
}
template <class T>
inline T simd_broadcast_first(T v, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 7);
  return msl_hx::value_of<T>(__builtin_ctz(msl_hx::my_group().active));
}
template <class T>
inline T simd_sum(T v, MSL_HX_SITE) {
  return msl_hx::tree_reduce(v, T(0), [](const T& a, const T& b) { return T(a + b); }, msl_file, msl_line, 8);
}
template <class T>
inline T simd_product(T v, MSL_HX_SITE) {
  return msl_hx::tree_reduce(v, T(1), [](const T& a, const T& b) { return T(a * b); }, msl_file, msl_line, 9);
}
template <class T>
inline T simd_max(T v, MSL_HX_SITE) {
  return msl_hx::tree_reduce(v, msl_hx::lowest<T>(), [](const T& a, const T& b) { return max(a, b); }, msl_file,
                             msl_line, 10);
}
template <class T>
inline T simd_min(T v, MSL_HX_SITE) {
  return msl_hx::tree_reduce(v, msl_hx::highest<T>(), [](const T& a, const T& b) { return min(a, b); }, msl_file,
                             msl_line, 11);
}
template <class T>
inline T simd_prefix_exclusive_sum(T v, MSL_HX_SITE) {
  msl_hx::deposit(v);
  msl_hx::arrive(msl_file, msl_line, 12);
  T s = T(0);
  for (uint l = 0; l < msl_hx::tl_lane->lane; ++l)
    if (msl_hx::is_active(int(l))) s = T(s + msl_hx::value_of<T>(int(l)));
  return s;
}
template <class T>
inline T simd_prefix_inclusive_sum(T v, MSL_HX_SITE) {
  return T(simd_prefix_exclusive_sum(v, msl_file, msl_line) + v);
}

struct simd_vote {
  using vote_t = uint64_t;
  vote_t bits;
  explicit operator vote_t() const { return bits; }
  bool any() const { return bits != 0; }
  bool all() const { return bits == msl_hx::my_group().active; }
};
inline simd_vote simd_ballot(bool b, MSL_HX_SITE) {
  msl_hx::deposit(b);
  msl_hx::arrive(msl_file, msl_line, 13);
  uint64_t bits = 0;
  for (int l = 0; l < msl_hx::kSimdWidth; ++l)
    if (msl_hx::is_active(l) && msl_hx::value_of<bool>(l)) bits |= uint64_t(1) << l;
  return simd_vote{bits};
}
inline bool simd_all(bool b, MSL_HX_SITE) { return simd_ballot(b, msl_file, msl_line).bits == msl_hx::my_group().active; }
inline bool simd_any(bool b, MSL_HX_SITE) { return simd_ballot(b, msl_file, msl_line).bits != 0; }
inline bool simd_is_first(MSL_HX_SITE) {
  msl_hx::deposit(0);
  msl_hx::arrive(msl_file, msl_line, 14);
  return int(msl_hx::tl_lane->lane) == __builtin_ctz(msl_hx::my_group().active);
}
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none, MSL_HX_SITE) {
  msl_hx::deposit(0);
  msl_hx::arrive(msl_file, msl_line, 15);
}
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none, MSL_HX_SITE) {
  msl_hx::wait_barrier(msl_hx::Site{msl_file, msl_line, 16});
}

#undef MSL_HX_SITE

}  // namespace metal
