// MSL scalar and vector types and the metal:: math the kernels use, as C++17.
//
// half is _Float16 and bfloat a struct that rounds to nearest even, so storage
// and conversions are bit-exact; arithmetic on them goes through float.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

namespace metal {

// ----------------------------------------------------------------- bfloat
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  static uint16_t round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // keep NaN quiet
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  template <class S, std::enable_if_t<std::is_arithmetic<S>::value || std::is_same<S, half>::value, int> = 0>
  bfloat(S v) : bits(round(float(v))) {}
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  bfloat operator-() const {
    bfloat r;
    r.bits = uint16_t(bits ^ 0x8000u);
    return r;
  }
  bfloat& operator+=(bfloat o) { return *this = bfloat(float(*this) + float(o)); }
  bfloat& operator-=(bfloat o) { return *this = bfloat(float(*this) - float(o)); }
  bfloat& operator*=(bfloat o) { return *this = bfloat(float(*this) * float(o)); }
  bfloat& operator/=(bfloat o) { return *this = bfloat(float(*this) / float(o)); }
};
inline bfloat operator+(bfloat a, bfloat b) { return bfloat(float(a) + float(b)); }
inline bfloat operator-(bfloat a, bfloat b) { return bfloat(float(a) - float(b)); }
inline bfloat operator*(bfloat a, bfloat b) { return bfloat(float(a) * float(b)); }
inline bfloat operator/(bfloat a, bfloat b) { return bfloat(float(a) / float(b)); }

template <class T>
struct is_scalar_type
    : std::integral_constant<bool, std::is_arithmetic<T>::value || std::is_same<T, half>::value ||
                                       std::is_same<T, bfloat>::value> {};

// ----------------------------------------------------------------- vectors
template <class T, int N>
struct vec;
template <class T>
struct is_vec : std::false_type {};
template <class T, int N>
struct is_vec<vec<T, N>> : std::true_type {};
template <class T>
struct components : std::integral_constant<int, 1> {};
template <class T, int N>
struct components<vec<T, N>> : std::integral_constant<int, N> {};

// A swizzle view (v.xy, v.zyx, ...) living in the vector's storage union.
template <class T, int S, int... I>
struct swizzle {
  T e[S];
  using result = vec<T, int(sizeof...(I))>;
  operator result() const { return result(e[I]...); }
  swizzle& operator=(const result& r) {
    int k = 0;
    ((e[I] = r[k++]), ...);
    return *this;
  }
  swizzle& operator=(const swizzle& o) { return *this = result(o); }
};
template <class T, int S, int... I>
struct components<swizzle<T, S, I...>> : std::integral_constant<int, int(sizeof...(I))> {};

template <class T, int N>
struct vec_storage;
template <class T>
struct vec_storage<T, 2> {
  union {
    T e[2];
    struct { T x, y; };
    struct { T r, g; };
    swizzle<T, 2, 1, 0> yx;
  };
};
template <class T>
struct vec_storage<T, 3> {
  union {
    T e[4];  // MSL 3-vectors take the space of 4
    struct { T x, y, z; };
    struct { T r, g, b; };
    swizzle<T, 4, 0, 1> xy;
    swizzle<T, 4, 1, 2> yz;
    swizzle<T, 4, 2, 1, 0> zyx;
  };
};
template <class T>
struct vec_storage<T, 4> {
  union {
    T e[4];
    struct { T x, y, z, w; };
    struct { T r, g, b, a; };
    swizzle<T, 4, 0, 1> xy;
    swizzle<T, 4, 2, 3> zw;
    swizzle<T, 4, 0, 1, 2> xyz;
    swizzle<T, 4, 3, 2, 1, 0> wzyx;
  };
};

template <class T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec : vec_storage<T, N> {
  using value_type = T;
  using vec_storage<T, N>::e;

  vec() {
    for (int i = 0; i < N; ++i) e[i] = T(0);
  }
  // Copies go through memcpy: the swizzle views make the union's own copy ill-formed.
  vec(const vec& o) { std::memcpy((void*)e, (const void*)o.e, sizeof(e)); }
  vec& operator=(const vec& o) {
    std::memcpy((void*)e, (const void*)o.e, sizeof(e));
    return *this;
  }
  // float4(1.0f): splat
  template <class S, std::enable_if_t<is_scalar_type<S>::value, int> = 0>
  vec(S s) {
    for (int i = 0; i < N; ++i) e[i] = T(s);
  }
  // float4(h4): element type conversion
  template <class U, std::enable_if_t<!std::is_same<U, T>::value, int> = 0>
  explicit vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) e[i] = T(o[i]);
  }
  // float4(a, b, c, d), float4(xy, z, w), float4(xyz, w) ...
  template <class A, class B, class... C,
            std::enable_if_t<components<A>::value + components<B>::value + (0 + ... + components<C>::value) == N,
                             int> = 0>
  vec(const A& a, const B& b, const C&... c) {
    int k = 0;
    put(k, a);
    put(k, b);
    (put(k, c), ...);
  }
  template <class S>
  void put(int& k, const S& s) {
    e[k++] = T(s);
  }
  template <class U, int M>
  void put(int& k, const vec<U, M>& v) {
    for (int i = 0; i < M; ++i) e[k++] = T(v[i]);
  }
  template <class U, int S, int... I>
  void put(int& k, const swizzle<U, S, I...>& v) {
    put(k, typename swizzle<U, S, I...>::result(v));
  }

  T& operator[](int i) { return e[i]; }
  const T& operator[](int i) const { return e[i]; }

  vec operator-() const {
    vec r;
    for (int i = 0; i < N; ++i) r[i] = -e[i];
    return r;
  }

#define MSL_HX_VEC_OP(op)                                                                          \
  friend vec operator op(const vec& a, const vec& b) {                                             \
    vec r;                                                                                         \
    for (int i = 0; i < N; ++i) r[i] = T(a[i] op b[i]);                                            \
    return r;                                                                                      \
  }                                                                                                \
  template <class S, std::enable_if_t<is_scalar_type<S>::value, int> = 0>                          \
  friend vec operator op(const vec& a, S b) {                                                      \
    return a op vec(b);                                                                            \
  }                                                                                                \
  template <class S, std::enable_if_t<is_scalar_type<S>::value, int> = 0>                          \
  friend vec operator op(S a, const vec& b) {                                                      \
    return vec(a) op b;                                                                            \
  }                                                                                                \
  vec& operator op##=(const vec& b) { return *this = *this op b; }                                 \
  template <class S, std::enable_if_t<is_scalar_type<S>::value, int> = 0>                          \
  vec& operator op##=(S b) {                                                                       \
    return *this = *this op vec(b);                                                                \
  }
  MSL_HX_VEC_OP(+)
  MSL_HX_VEC_OP(-)
  MSL_HX_VEC_OP(*)
  MSL_HX_VEC_OP(/)
#undef MSL_HX_VEC_OP

#define MSL_HX_VEC_INT_OP(op)                                                                      \
  template <class U = T, std::enable_if_t<std::is_integral<U>::value, int> = 0>                    \
  friend vec operator op(const vec& a, const vec& b) {                                             \
    vec r;                                                                                         \
    for (int i = 0; i < N; ++i) r[i] = T(a[i] op b[i]);                                            \
    return r;                                                                                      \
  }
  MSL_HX_VEC_INT_OP(%)
  MSL_HX_VEC_INT_OP(&)
  MSL_HX_VEC_INT_OP(|)
  MSL_HX_VEC_INT_OP(^)
  MSL_HX_VEC_INT_OP(<<)
  MSL_HX_VEC_INT_OP(>>)
#undef MSL_HX_VEC_INT_OP

#define MSL_HX_VEC_CMP(op)                                                                         \
  friend vec<bool, N> operator op(const vec& a, const vec& b) {                                    \
    vec<bool, N> r;                                                                                \
    for (int i = 0; i < N; ++i) r[i] = a[i] op b[i];                                               \
    return r;                                                                                      \
  }
  MSL_HX_VEC_CMP(<)
  MSL_HX_VEC_CMP(>)
  MSL_HX_VEC_CMP(<=)
  MSL_HX_VEC_CMP(>=)
  MSL_HX_VEC_CMP(==)
  MSL_HX_VEC_CMP(!=)
#undef MSL_HX_VEC_CMP
};

#define MSL_HX_VEC_NAMES(T, name) \
  typedef vec<T, 2> name##2;      \
  typedef vec<T, 3> name##3;      \
  typedef vec<T, 4> name##4;
MSL_HX_VEC_NAMES(float, float)
MSL_HX_VEC_NAMES(half, half)
MSL_HX_VEC_NAMES(bfloat, bfloat)
MSL_HX_VEC_NAMES(int, int)
MSL_HX_VEC_NAMES(uint, uint)
MSL_HX_VEC_NAMES(short, short)
MSL_HX_VEC_NAMES(ushort, ushort)
MSL_HX_VEC_NAMES(char, char)
MSL_HX_VEC_NAMES(uchar, uchar)
MSL_HX_VEC_NAMES(bool, bool)
#undef MSL_HX_VEC_NAMES

template <class T, size_t N>
struct array {
  T data_[N];
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  static constexpr size_t size() { return N; }
};

// ----------------------------------------------------------------- limits
template <class T>
struct numeric_limits : std::numeric_limits<T> {};
template <>
struct numeric_limits<half> {
  static constexpr bool is_specialized = true;
  static half infinity() { return half(HUGE_VALF); }
  static half quiet_NaN() { return half(NAN); }
  static half max() { return half(65504.0f); }
  static half lowest() { return half(-65504.0f); }
  static half min() { return half(6.103515625e-05f); }
  static half epsilon() { return half(0.0009765625f); }
};
template <>
struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static bfloat infinity() { return bfloat(HUGE_VALF); }
  static bfloat quiet_NaN() { return bfloat(NAN); }
  static bfloat max() { return bfloat(3.38953139e38f); }
  static bfloat lowest() { return bfloat(-3.38953139e38f); }
  static bfloat min() { return bfloat(1.17549435e-38f); }
  static bfloat epsilon() { return bfloat(0.0078125f); }
};

// ----------------------------------------------------------------- math
// Each function is computed in float and returned in the argument's type.
#define MSL_HX_UNARY(name, expr)                                            \
  inline float name(float x) { return expr; }                               \
  inline half name(half h) {                                                \
    float x = float(h);                                                     \
    return half(expr);                                                      \
  }                                                                         \
  inline bfloat name(bfloat h) {                                            \
    float x = float(h);                                                     \
    return bfloat(expr);                                                    \
  }                                                                         \
  template <class T, int N>                                                 \
  vec<T, N> name(const vec<T, N>& v) {                                      \
    vec<T, N> r;                                                            \
    for (int i = 0; i < N; ++i) r[i] = name(v[i]);                          \
    return r;                                                               \
  }
MSL_HX_UNARY(exp, std::exp(x))
MSL_HX_UNARY(exp2, std::exp2(x))
MSL_HX_UNARY(exp10, std::pow(10.0f, x))
MSL_HX_UNARY(log, std::log(x))
MSL_HX_UNARY(log2, std::log2(x))
MSL_HX_UNARY(log10, std::log10(x))
MSL_HX_UNARY(sqrt, std::sqrt(x))
MSL_HX_UNARY(rsqrt, 1.0f / std::sqrt(x))
MSL_HX_UNARY(tanh, std::tanh(x))
MSL_HX_UNARY(sin, std::sin(x))
MSL_HX_UNARY(cos, std::cos(x))
MSL_HX_UNARY(fabs, std::fabs(x))
MSL_HX_UNARY(floor, std::floor(x))
MSL_HX_UNARY(ceil, std::ceil(x))
MSL_HX_UNARY(round, std::round(x))
MSL_HX_UNARY(rint, std::rint(x))
MSL_HX_UNARY(trunc, std::trunc(x))
MSL_HX_UNARY(erf, std::erf(x))
MSL_HX_UNARY(saturate, std::fmin(std::fmax(x, 0.0f), 1.0f))
#undef MSL_HX_UNARY

// Integer abs comes from the C library (::abs); these are the float kinds.
inline float abs(float x) { return std::fabs(x); }
inline half abs(half x) { return half(std::fabs(float(x))); }
inline bfloat abs(bfloat x) { return bfloat(std::fabs(float(x))); }
template <class T, int N>
vec<T, N> abs(const vec<T, N>& v) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = abs(v[i]);
  return r;
}

template <class T>
inline bool isnan(T x) { return std::isnan(float(x)); }
template <class T>
inline bool isinf(T x) { return std::isinf(float(x)); }
template <class T>
inline bool isfinite(T x) { return std::isfinite(float(x)); }
template <class T>
inline bool signbit(T x) { return std::signbit(float(x)); }

#define MSL_HX_MINMAX(T)                              \
  inline T max(T a, T b) { return a > b ? a : b; }    \
  inline T min(T a, T b) { return a < b ? a : b; }
MSL_HX_MINMAX(float)
MSL_HX_MINMAX(half)
MSL_HX_MINMAX(int)
MSL_HX_MINMAX(uint)
MSL_HX_MINMAX(short)
MSL_HX_MINMAX(ushort)
MSL_HX_MINMAX(long)
MSL_HX_MINMAX(ulong)
#undef MSL_HX_MINMAX
inline bfloat max(bfloat a, bfloat b) { return float(a) > float(b) ? a : b; }
inline bfloat min(bfloat a, bfloat b) { return float(a) < float(b) ? a : b; }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
template <class T, int N>
vec<T, N> max(const vec<T, N>& a, const vec<T, N>& b) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = max(a[i], b[i]);
  return r;
}
template <class T, int N>
vec<T, N> min(const vec<T, N>& a, const vec<T, N>& b) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = min(a[i], b[i]);
  return r;
}
template <class T>
inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
template <class T, int N>
vec<T, N> fma(const vec<T, N>& a, const vec<T, N>& b, const vec<T, N>& c) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = T(std::fma(float(a[i]), float(b[i]), float(c[i])));
  return r;
}
inline float pow(float a, float b) { return std::pow(a, b); }
inline float powr(float a, float b) { return std::pow(a, b); }
inline float copysign(float a, float b) { return std::copysign(a, b); }
template <class T>
inline T select(T if_false, T if_true, bool c) { return c ? if_true : if_false; }
template <class T, int N>
vec<T, N> select(const vec<T, N>& f, const vec<T, N>& t, const vec<bool, N>& c) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = c[i] ? t[i] : f[i];
  return r;
}
template <class T>
inline T mix(T x, T y, T a) { return x + (y - x) * a; }
template <class T, int N>
T dot(const vec<T, N>& a, const vec<T, N>& b) {
  T s = T(0);
  for (int i = 0; i < N; ++i) s += a[i] * b[i];
  return s;
}
template <int N>
bool all(const vec<bool, N>& v) {
  for (int i = 0; i < N; ++i)
    if (!v[i]) return false;
  return true;
}
template <int N>
bool any(const vec<bool, N>& v) {
  for (int i = 0; i < N; ++i)
    if (v[i]) return true;
  return false;
}
inline bool all(bool b) { return b; }
inline bool any(bool b) { return b; }

template <class To, class From>
inline To as_type(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes differ");
  To to;
  std::memcpy((void*)&to, (const void*)&from, sizeof(To));
  return to;
}
inline uint popcount(uint x) { return uint(__builtin_popcount(x)); }
inline uint clz(uint x) { return x ? uint(__builtin_clz(x)) : 32u; }
inline uint ctz(uint x) { return x ? uint(__builtin_ctz(x)) : 32u; }

// fast:: and precise:: differ on a GPU; here both are the float functions.
namespace fast {
using metal::abs;
using metal::clamp;
using metal::cos;
using metal::exp;
using metal::exp2;
using metal::fabs;
using metal::log;
using metal::log2;
using metal::max;
using metal::min;
using metal::pow;
using metal::powr;
using metal::rsqrt;
using metal::sin;
using metal::sqrt;
using metal::tanh;
}  // namespace fast
namespace precise {
using namespace fast;
inline float divide(float a, float b) { return a / b; }
}

enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }

using std::conditional_t;
using std::enable_if_t;
using std::is_same;
using std::is_same_v;

}  // namespace metal

#define M_LOG2E_F 1.4426950408889634f
#define M_LN2_F 0.6931471805599453f
#define M_E_F 2.718281828459045f
#define MAXFLOAT FLT_MAX
#define MAXHALF 65504.0f
