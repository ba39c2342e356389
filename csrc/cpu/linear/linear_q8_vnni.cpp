// int8-activation quantized matmul kernels for AVX-512 with VNNI, VBMI and
// GFNI (vpdpbusd: code bytes x activation bytes, 4 products summed per int32
// lane). See linear_q8.h for the arithmetic.
#include "cpu/linear/linear_q8.h"

#if VLLM_METAL_X86_DISPATCH
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/tile_math.h"

#if defined(__clang__)
#pragma clang attribute push(                                                                   \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx512vbmi,gfni,avx2,fma,f16c")
#endif

namespace vllm_metal::cpu::vnni {
namespace {

// The weights stream from memory once per token. The hardware prefetcher
// alone kept one core near 20 GB/s; asking for the codes 6 KiB ahead into L2
// (and the scales and biases, which move 8-16x slower, 1 KiB ahead) gave
// 26-31 GB/s on a 32 MB matrix (Zen 4; 2-4 KiB or into L1 was slower).
constexpr int kPrefetchCodes = 6144;
constexpr int kPrefetchScales = 1024;

VLLM_METAL_INLINE void prefetch_l2(const void* p, int64_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T1);
}

VLLM_METAL_INLINE __mmask16 mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF)
                 : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1u);
}

VLLM_METAL_INLINE __mmask64 mask64(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << std::max<int64_t>(n, 0)) - 1);
}

// Up to 16 scales (or biases) of storage type S as fp32 lanes; the rest 0.
template <typename S>
VLLM_METAL_INLINE __m512 load_scales(const typename S::storage* p, int64_t count) {
  const __mmask16 m = mask16(count);
  if constexpr (std::is_same_v<S, F32>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (std::is_same_v<S, BF16>) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
}

// Each byte's high nibble moved down (bits 4-7 to 0-3, the rest cleared) by
// one GF(2) affine op instead of a shift and a mask: a 4-bit GEMV spends
// nearly all its instructions per code load, and this one took ~4% of it.
VLLM_METAL_INLINE __m512i high_nibbles(__m512i v) {
  return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(0x1020408000000000LL), 0);
}

VLLM_METAL_INLINE int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// --- activation quantization ---------------------------------------------

void quantize_row(const float* x, int64_t k, int64_t kp, int bits, int group_size, int8_t* q,
                  float* d, float* xsum) {
  // Natural order first (the 4-bit layout is a byte permute of it).
  alignas(64) int8_t nat[kChunk4];
  const int64_t chunk = bits == 4 ? kChunk4 : kChunk8;
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t c0 = 0; c0 < kp; c0 += chunk) {
    int8_t* dst = bits == 4 ? nat : q + c0;
    for (int64_t b0 = c0; b0 < c0 + chunk; b0 += kQ8Block) {
      const __m512 v0 = _mm512_maskz_loadu_ps(mask16(k - b0), x + b0);
      const __m512 v1 = _mm512_maskz_loadu_ps(mask16(k - b0 - 16), x + b0 + 16);
      const float amax = _mm512_reduce_max_ps(
          _mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      d[b0 / kQ8Block] = amax / 127.0f;
      const __m512 s = _mm512_set1_ps(inv);
      // Default rounding (nearest even), as std::nearbyint in the portable kernel.
      const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, s)));
      const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, s)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (b0 - c0)), q0);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (b0 - c0) + 16), q1);
    }
    if (bits == 4) {
      // Even columns of the chunk, then the odd ones.
      alignas(64) static const uint8_t even[64] = {
          0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
          32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62,
          64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94,
          96, 98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126};
      const __m512i lo = _mm512_load_si512(nat), hi = _mm512_load_si512(nat + 64);
      const __m512i ie = _mm512_load_si512(even);
      const __m512i io = _mm512_add_epi8(ie, _mm512_set1_epi8(1));
      _mm512_storeu_si512(q + c0, _mm512_permutex2var_epi8(lo, ie, hi));
      _mm512_storeu_si512(q + c0 + 64, _mm512_permutex2var_epi8(lo, io, hi));
    }
  }
  for (int64_t g = 0; g < k / group_size; ++g) {
    __m512 s = _mm512_setzero_ps();
    for (int c = 0; c < group_size; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * group_size + c));
    xsum[g] = _mm512_reduce_add_ps(s);
  }
}

// --- GEMV: W read in its own layout, 64 bytes per step ---------------------
//
// Per 64-byte load of one row of W: the nibble split, one or two vpdpbusd,
// one conversion, one permute and one FMA. The group scale and the
// activation step meet once per window of 16 blocks (512 columns at 4 bits),
// as sd[b] = scale[group(b)] * d[b]; each load's lanes then pick their block's
// factor with a permute. The bias share (sum_g bias[g] * xsum[g]) goes into the
// same accumulator, a window at a time, so a row ends in one reduction.
// Measured single-threaded, this keeps a core ahead of its share of DRAM;
// the previous form (scales loaded, converted and multiplied per load, the
// bias in a second pass) held a core to 11-14 GB/s.

constexpr int kWindowBlocks = 16;

// Rows [n, n + NR) of W against rows [i0, i0 + MR) of a.
template <int MR, int NR, int BITS, typename S>
VLLM_METAL_INLINE void gemv_tile(const QuantMatrix& w, const Q8Acts& a, int64_t i0, int64_t n,
                                 float* y, int64_t ldy) {
  using ST = typename S::storage;
  constexpr int64_t chunk = BITS == 4 ? kChunk4 : kChunk8;
  constexpr int64_t chunk_blocks = chunk / kQ8Block;                // 4 or 2
  constexpr int64_t window_chunks = kWindowBlocks / chunk_blocks;   // 4 or 8
  const int64_t k = w.k, groups = k / w.group_size;
  const int64_t row_bytes = k * BITS / 8;
  const int64_t chunks = a.kp / chunk;
  const int64_t blocks = a.kp / kQ8Block;
  // Blocks per group is 1, 2 or 4 (group sizes 32, 64, 128).
  const int gshift = __builtin_ctzll(static_cast<unsigned long long>(w.group_size / kQ8Block));
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  // Lane l of a load (4 code bytes) lies in the load's block l / 4 at 4 bits, l / 8 at 8.
  const __m512i lane_block = _mm512_srli_epi32(iota, BITS == 4 ? 2 : 3);
  const __m512i block_group = _mm512_srli_epi32(iota, gshift);
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const uint8_t* wrow[NR];
  const ST* srow[NR];
  const ST* brow[NR];
  for (int j = 0; j < NR; ++j) {
    wrow[j] = reinterpret_cast<const uint8_t*>(w.w) + (n + j) * row_bytes;
    srow[j] = static_cast<const ST*>(w.scales) + (n + j) * groups;
    brow[j] = w.biases ? static_cast<const ST*>(w.biases) + (n + j) * groups : nullptr;
  }
  const __m512 neg_zero_point = _mm512_set1_ps(-w.zero_point);
  __m512 acc[MR][NR], sd[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  __m512i pick = lane_block;
  for (int64_t c = 0; c < chunks; ++c) {
    if (c % window_chunks == 0) {
      const int64_t b0 = c * chunk_blocks, g0 = b0 >> gshift;
      const int64_t gcount = std::min<int64_t>(kWindowBlocks >> gshift, groups - g0);
      const __mmask16 gm = mask16(gcount);
      for (int j = 0; j < NR; ++j) {
        prefetch_l2(srow[j] + g0, kPrefetchScales);
        const __m512 sg = load_scales<S>(srow[j] + g0, gcount);
        const __m512 sv = _mm512_permutexvar_ps(block_group, sg);
        __m512 bv;
        if (brow[j]) {
          prefetch_l2(brow[j] + g0, kPrefetchScales);
          bv = load_scales<S>(brow[j] + g0, gcount);
        } else {
          bv = _mm512_mul_ps(sg, neg_zero_point);
        }
        for (int i = 0; i < MR; ++i) {
          const __m512 dv = _mm512_maskz_loadu_ps(mask16(blocks - b0),
                                                  a.d.get() + (i0 + i) * blocks + b0);
          const __m512 xs = _mm512_maskz_loadu_ps(gm, a.xsum.get() + (i0 + i) * groups + g0);
          sd[i][j] = _mm512_mul_ps(sv, dv);
          acc[i][j] = _mm512_fmadd_ps(bv, xs, acc[i][j]);
        }
      }
      pick = lane_block;
    }
    const __mmask64 wm = mask64(row_bytes - c * 64);
    for (int j = 0; j < NR; ++j) {
      prefetch_l2(wrow[j] + c * 64, kPrefetchCodes);
      const __m512i wv = _mm512_maskz_loadu_epi8(wm, wrow[j] + c * 64);
      __m512i lo = wv, hi = wv;
      if constexpr (BITS == 4) {
        lo = _mm512_and_si512(wv, nib);
        hi = high_nibbles(wv);
      }
      for (int i = 0; i < MR; ++i) {
        const int8_t* qi = a.q.get() + (i0 + i) * a.kp + c * chunk;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(qi));
        if constexpr (BITS == 4) dot = _mm512_dpbusd_epi32(dot, hi, _mm512_loadu_si512(qi + 64));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                    _mm512_permutexvar_ps(pick, sd[i][j]), acc[i][j]);
      }
    }
    pick = _mm512_add_epi32(pick, _mm512_set1_epi32(static_cast<int>(chunk_blocks)));
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int MR, int BITS, typename S>
void gemv_rows(const QuantMatrix& w, const Q8Acts& a, int64_t i0, int64_t n0, int64_t n1,
               float* y, int64_t ldy) {
  constexpr int kRows = MR == 1 ? 4 : 2;
  int64_t n = n0;
  for (; n + kRows <= n1; n += kRows) gemv_tile<MR, kRows, BITS, S>(w, a, i0, n, y + (n - n0), ldy);
  for (; n < n1; ++n) gemv_tile<MR, 1, BITS, S>(w, a, i0, n, y + (n - n0), ldy);
}

template <int BITS, typename S>
void gemv_bits(const QuantMatrix& w, const Q8Acts& a, int64_t i0, int mr, int64_t n0, int64_t n1,
               float* y, int64_t ldy) {
  switch (mr) {
    case 1:
      return gemv_rows<1, BITS, S>(w, a, i0, n0, n1, y, ldy);
    case 2:
      return gemv_rows<2, BITS, S>(w, a, i0, n0, n1, y, ldy);
    case 3:
      return gemv_rows<3, BITS, S>(w, a, i0, n0, n1, y, ldy);
    default:
      return gemv_rows<4, BITS, S>(w, a, i0, n0, n1, y, ldy);
  }
}

template <typename F>
void with_types(const QuantMatrix& w, F&& f) {
  auto bits = [&](auto s) {
    using S = decltype(s);
    if (w.bits == 4) {
      f(std::integral_constant<int, 4>{}, S{});
    } else {
      f(std::integral_constant<int, 8>{}, S{});
    }
  };
  switch (w.scale_type) {
    case Elem::F32:
      return bits(F32{});
    case Elem::BF16:
      return bits(BF16{});
    default:
      return bits(F16{});
  }
}

// A work item's first kPrefetchCodes bytes of codes (and its first scales and
// biases) asked for at once: the in-loop prefetches run that far ahead, so
// without this the item's start waits on one demand miss after another.
template <typename S>
VLLM_METAL_INLINE void prime_rows(const QuantMatrix& w, int64_t n0, int64_t n1) {
  using ST = typename S::storage;
  const int64_t row_bytes = w.k * w.bits / 8, groups = w.k / w.group_size;
  const auto* codes = static_cast<const char*>(static_cast<const void*>(w.w)) + n0 * row_bytes;
  const int64_t code_bytes = std::min<int64_t>((n1 - n0) * row_bytes, kPrefetchCodes);
  for (int64_t off = 0; off < code_bytes; off += 64) _mm_prefetch(codes + off, _MM_HINT_T1);
  const int64_t scale_bytes =
      std::min<int64_t>((n1 - n0) * groups * static_cast<int64_t>(sizeof(ST)), kPrefetchScales);
  for (const void* base : {w.scales, w.biases}) {
    if (base == nullptr) continue;
    const auto* p = reinterpret_cast<const char*>(static_cast<const ST*>(base) + n0 * groups);
    for (int64_t off = 0; off < scale_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
  }
}

void gemv(const QuantMatrix& w, const Q8Acts& a, int64_t i0, int mr, int64_t n0, int64_t n1,
          float* y, int64_t ldy) {
  with_types(w, [&](auto bits, auto s) {
    prime_rows<decltype(s)>(w, n0, n1);
    gemv_bits<decltype(bits)::value, decltype(s)>(w, a, i0, mr, n0, n1, y, ldy);
  });
}

// --- GEMM: W repacked per 16-row tile, one activation dword broadcast ------

// A tile of 16 rows of W: words[wi * 16 + r] = word wi of row r; scales and
// biases [groups, 16] as fp32. Rows past the matrix are zero.
struct Tile {
  uint32_t* words;
  float* scales;
  float* biases;
};

// dst[c * 16 + r] = src[r][c] for a 16 x 16 block of 32-bit values.
VLLM_METAL_INLINE void transpose16(__m512i (&v)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    v[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // v[4i + c]: 128-bit lane L holds column 4L + c of rows 4i .. 4i + 3.
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x88);      // lanes 0,2 | 0,2
    const __m512i b = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xDD);      // lanes 1,3 | 1,3
    const __m512i e = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x88);
    const __m512i f = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xDD);
    t[c] = _mm512_shuffle_i32x4(a, e, 0x88);      // column c
    t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);  // column 8 + c
    t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);  // column 4 + c
    t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD); // column 12 + c
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

// Rows t0 .. t0 + cols - 1 of W (the rest of the tile zero), transposed by
// 16 x 16 blocks into dst[c * 16 + r]. WHAT 0: code words; 1: scales; 2:
// biases (as fp32 bits).
template <typename S, int WHAT>
void repack_part(const QuantMatrix& w, int64_t t0, int cols, uint32_t* dst) {
  using ST = typename S::storage;
  const int64_t groups = w.k / w.group_size;
  const int64_t total = WHAT == 0 ? w.k * w.bits / 32 : groups;
  for (int64_t c0 = 0; c0 < total; c0 += 16) {
    const int64_t count = std::min<int64_t>(16, total - c0);
    __m512i v[16];
    for (int r = 0; r < 16; ++r) {
      if (r >= cols) {
        v[r] = _mm512_setzero_si512();
      } else if constexpr (WHAT == 0) {
        v[r] = _mm512_maskz_loadu_epi32(mask16(count), w.w + (t0 + r) * total + c0);
      } else {
        const ST* base = static_cast<const ST*>(WHAT == 1 ? w.scales : w.biases);
        v[r] = _mm512_castps_si512(load_scales<S>(base + (t0 + r) * groups + c0, count));
      }
    }
    transpose16(v);
    for (int c = 0; c < count; ++c) _mm512_storeu_si512(dst + (c0 + c) * kQ8TileCols, v[c]);
  }
}

// The next tile's rows (contiguous in W, scales and biases) into L2 while
// this one computes: the repack's row loads are where W comes from memory.
template <typename S>
VLLM_METAL_INLINE void prefetch_tile(const QuantMatrix& w, int64_t t0) {
  using ST = typename S::storage;
  const int64_t rows = std::min<int64_t>(kQ8TileCols, w.n - t0);
  const int64_t groups = w.k / w.group_size;
  const auto* codes = reinterpret_cast<const char*>(w.w + t0 * (w.k * w.bits / 32));
  for (int64_t off = 0; off < rows * w.k * w.bits / 8; off += 64) {
    _mm_prefetch(codes + off, _MM_HINT_T1);
  }
  for (const void* base : {w.scales, w.biases}) {
    if (base == nullptr) continue;
    const auto* p = reinterpret_cast<const char*>(static_cast<const ST*>(base) + t0 * groups);
    for (int64_t off = 0; off < rows * groups * static_cast<int64_t>(sizeof(ST)); off += 64) {
      _mm_prefetch(p + off, _MM_HINT_T1);
    }
  }
}

template <typename S>
Tile repack(const QuantMatrix& w, int64_t t0, int cols, void* scratch) {
  const int64_t wpr = w.k * w.bits / 32, groups = w.k / w.group_size;
  Tile t;
  t.words = static_cast<uint32_t*>(scratch);
  t.scales = reinterpret_cast<float*>(t.words + wpr * kQ8TileCols);
  t.biases = t.scales + groups * kQ8TileCols;
  repack_part<S, 0>(w, t0, cols, t.words);
  repack_part<S, 1>(w, t0, cols, reinterpret_cast<uint32_t*>(t.scales));
  if (w.biases) {
    repack_part<S, 2>(w, t0, cols, reinterpret_cast<uint32_t*>(t.biases));
  } else {
    const __m512 neg_zero_point = _mm512_set1_ps(-w.zero_point);
    for (int64_t i = 0; i < groups * kQ8TileCols; i += 16) {
      _mm512_storeu_ps(t.biases + i, _mm512_mul_ps(_mm512_loadu_ps(t.scales + i), neg_zero_point));
    }
  }
  return t;
}

// Rows [i0, i0 + MR) of a against one tile: y[i * ldy + j] for j < cols.
// The group's scale is applied per block (scale * d_b), so one accumulator
// per row serves every group size.
template <int MR, int BITS>
VLLM_METAL_INLINE void gemm_tile(const Tile& t, const Q8Acts& a, int64_t i0, int cols, float* y,
                                 int64_t ldy) {
  constexpr int words_per_block = kQ8Block * BITS / 32;
  const int64_t gs = a.group_size, groups = a.k / gs;
  const int64_t blocks_per_group = gs / kQ8Block;
  const int64_t dstride = a.kp / kQ8Block;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const int8_t* q[MR];
  const float* d[MR];
  const float* xs[MR];
  for (int i = 0; i < MR; ++i) {
    q[i] = a.q.get() + (i0 + i) * a.kp;
    d[i] = a.d.get() + (i0 + i) * dstride;
    xs[i] = a.xsum.get() + (i0 + i) * groups;
  }
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const __m512 sv = _mm512_loadu_ps(t.scales + g * kQ8TileCols);
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      __m512i dot[MR];
      for (int i = 0; i < MR; ++i) dot[i] = _mm512_setzero_si512();
      for (int wb = 0; wb < words_per_block; ++wb) {
        const int64_t wi = b * words_per_block + wb;
        const __m512i wv = _mm512_loadu_si512(t.words + wi * kQ8TileCols);
        if constexpr (BITS == 4) {
          const __m512i lo = _mm512_and_si512(wv, nib);
          const __m512i hi = high_nibbles(wv);
          // Word wi holds columns 8 wi .. 8 wi + 7: evens at pos, odds at pos + 64.
          const int64_t pos = wi / 16 * kChunk4 + (wi % 16) * 4;
          for (int i = 0; i < MR; ++i) {
            dot[i] = _mm512_dpbusd_epi32(dot[i], lo, _mm512_set1_epi32(load_i32(q[i] + pos)));
            dot[i] = _mm512_dpbusd_epi32(dot[i], hi, _mm512_set1_epi32(load_i32(q[i] + pos + 64)));
          }
        } else {
          for (int i = 0; i < MR; ++i) {
            dot[i] = _mm512_dpbusd_epi32(dot[i], wv, _mm512_set1_epi32(load_i32(q[i] + wi * 4)));
          }
        }
      }
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i]),
                                 _mm512_mul_ps(sv, _mm512_set1_ps(d[i][b])), acc[i]);
      }
    }
    const __m512 bv = _mm512_loadu_ps(t.biases + g * kQ8TileCols);
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xs[i][g]), acc[i]);
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, mask16(cols), acc[i]);
}

constexpr int kGemmRows = 8;

template <int BITS, int MR = kGemmRows>
VLLM_METAL_INLINE void gemm_rest(const Tile& t, const Q8Acts& a, int64_t i, int rows, int cols,
                                 float* y, int64_t ldy) {
  if constexpr (MR > 0) {
    if (rows == MR) return gemm_tile<MR, BITS>(t, a, i, cols, y, ldy);
    return gemm_rest<BITS, MR - 1>(t, a, i, rows, cols, y, ldy);
  }
}

template <int BITS, typename S>
void gemm_bits(const QuantMatrix& w, const Q8Acts& a, int64_t n0, int64_t n1, float* y,
               int64_t ldy, void* scratch) {
  for (int64_t t0 = n0; t0 < n1; t0 += kQ8TileCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kQ8TileCols, n1 - t0));
    const Tile t = repack<S>(w, t0, cols, scratch);
    if (t0 + kQ8TileCols < n1) prefetch_tile<S>(w, t0 + kQ8TileCols);
    float* yt = y + (t0 - n0);
    int64_t i = 0;
    for (; i + kGemmRows <= a.m; i += kGemmRows) {
      gemm_tile<kGemmRows, BITS>(t, a, i, cols, yt + i * ldy, ldy);
    }
    if (i < a.m) gemm_rest<BITS>(t, a, i, static_cast<int>(a.m - i), cols, yt + i * ldy, ldy);
  }
}

void gemm(const QuantMatrix& w, const Q8Acts& a, int64_t n0, int64_t n1, float* y, int64_t ldy,
          void* scratch) {
  with_types(w, [&](auto bits, auto s) {
    gemm_bits<decltype(bits)::value, decltype(s)>(w, a, n0, n1, y, ldy, scratch);
  });
}

const Q8Kernels kTable = {quantize_row, gemv, gemm};

} // namespace
} // namespace vllm_metal::cpu::vnni

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace vllm_metal::cpu {

const Q8Kernels* q8_kernels_vnni() {
  static const bool ok = [] {
    __builtin_cpu_init();
    // Every CPU with VNNI and VBMI so far (Ice Lake on, Zen 4 on) has GFNI too.
    return detected_isa() == Isa::Avx512 && __builtin_cpu_supports("avx512vnni") &&
        __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
  }();
  return ok ? &vnni::kTable : nullptr;
}

} // namespace vllm_metal::cpu
#endif
