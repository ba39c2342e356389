// int8-activation quantized matmul kernels for AVX-512 with VNNI, VBMI and
// GFNI (vpdpbusd: code bytes x activation bytes, 4 products summed per int32
// lane), and, where the CPU has AMX-INT8, tdpbsud for blocks of 16 rows. See
// linear_q8.h for the arithmetic.
#include "cpu/linear/linear_q8.h"

#if VLLM_METAL_X86_DISPATCH
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/tile_math.h"

#if defined(__clang__)
#pragma clang attribute push(                                                               \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx512vbmi,gfni,"   \
                          "amx-tile,amx-int8,avx2,fma,f16c"))),                                  \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx512vbmi,gfni,amx-tile,amx-int8")
#pragma GCC target("avx2,fma,f16c")
#endif

namespace vllm_metal::cpu::vnni {
namespace {

// The weights stream from memory once per token. The hardware prefetcher
// alone kept one core near 20 GB/s; asking for the codes 6 KiB ahead into L2
// (and the scales and biases, which move 8-16x slower, 1 KiB ahead) gave
// 26-31 GB/s on a 32 MB matrix (Zen 4, measured with the per-row kernel this
// tiled one replaced; 2-4 KiB or into L1 was slower). A tiled W is one stream.
constexpr int kPrefetchCodes = 6144;
constexpr int kPrefetchScales = 1024;

VLLM_METAL_INLINE void prefetch_l2(const void* p, int64_t ahead) {
  _mm_prefetch(static_cast<const char*>(p) + ahead, _MM_HINT_T1);
}

VLLM_METAL_INLINE __mmask16 mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF)
                 : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1u);
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
  alignas(64) int8_t nat[kChunk8];
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t c0 = 0; c0 < kp; c0 += kChunk8) {
    int8_t* dst = bits == 4 ? nat : q + c0;
    for (int64_t b0 = c0; b0 < c0 + kChunk8; b0 += kQ8Block) {
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
      // Each block's even columns, then its odd ones (q8_position).
      alignas(64) static const uint8_t order[64] = {
          0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
          1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
          32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62,
          33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
      _mm512_storeu_si512(q + c0, _mm512_permutexvar_epi8(_mm512_load_si512(order),
                                                          _mm512_load_si512(nat)));
    }
  }
  for (int64_t g = 0; g < k / group_size; ++g) {
    __m512 s = _mm512_setzero_ps();
    for (int c = 0; c < group_size; c += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + g * group_size + c));
    xsum[g] = _mm512_reduce_add_ps(s);
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

// --- GEMM: W by tiles of 16 rows -----------------------------------------

// A tile of 16 rows of W in the tiled order (linear_cpu.h): words[wi * 16 + r]
// = word wi of row r; scales and biases [groups, 16] of storage type ST,
// biases null for symmetric weights. Rows past the matrix are zero.
template <typename ST>
struct Tile {
  const uint32_t* words;
  const ST* scales;
  const ST* biases;
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

// Rows t0 .. t0 + cols - 1 of W in MLX's layout (the rest of the tile zero),
// transposed by 16 x 16 blocks into dst[c * 16 + r]. WHAT 0: code words; 1:
// scales; 2: biases (as fp32 bits).
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

// The last, partial tile of a tiled W ([per_row, h] blocks) widened to 16
// rows: WHAT as repack_part.
template <typename S, int WHAT>
void widen_part(const QuantMatrix& w, int64_t t0, int h, uint32_t* dst) {
  using ST = typename S::storage;
  const int64_t groups = w.k / w.group_size;
  const int64_t total = WHAT == 0 ? w.k * w.bits / 32 : groups;
  const __mmask16 m = mask16(h);
  for (int64_t c = 0; c < total; ++c) {
    __m512i v;
    if constexpr (WHAT == 0) {
      v = _mm512_maskz_loadu_epi32(m, w.w + t0 * total + c * h);
    } else {
      const ST* base = static_cast<const ST*>(WHAT == 1 ? w.scales : w.biases);
      v = _mm512_castps_si512(load_scales<S>(base + t0 * groups + c * h, h));
    }
    _mm512_storeu_si512(dst + c * kQ8TileCols, v);
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

// Rows [t0, t0 + cols) of W as a tile with fp32 scales in scratch: repacked
// from MLX's layout, or widened from a tiled W's partial last tile.
template <typename S>
Tile<float> repack(const QuantMatrix& w, int64_t t0, int cols, void* scratch) {
  const int64_t wpr = w.k * w.bits / 32, groups = w.k / w.group_size;
  auto* words = static_cast<uint32_t*>(scratch);
  auto* scales = reinterpret_cast<float*>(words + wpr * kQ8TileCols);
  float* biases = w.biases ? scales + groups * kQ8TileCols : nullptr;
  auto* s32 = reinterpret_cast<uint32_t*>(scales);
  auto* b32 = reinterpret_cast<uint32_t*>(biases);
  if (w.tiled) {
    widen_part<S, 0>(w, t0, cols, words);
    widen_part<S, 1>(w, t0, cols, s32);
    if (biases) widen_part<S, 2>(w, t0, cols, b32);
  } else {
    repack_part<S, 0>(w, t0, cols, words);
    repack_part<S, 1>(w, t0, cols, s32);
    if (biases) repack_part<S, 2>(w, t0, cols, b32);
  }
  return {words, scales, biases};
}

// Rows [i0, i0 + MR) of a against one tile: y[i * ldy + j] for j < cols, in
// the order linear_q8.h gives. A block's integer dot is summed in two chains
// for few rows (one vpdpbusd chain of 8 would wait on its own latency); the
// sum is exact either way.
template <int MR, int BITS, typename S>
VLLM_METAL_INLINE void gemm_tile(const Tile<typename S::storage>& t, const Q8Acts& a,
                                 int64_t i0, int cols, float* y, int64_t ldy,
                                 float zero_point, bool stream) {
  constexpr int words_per_block = kQ8Block * BITS / 32;
  constexpr int chains = MR <= 4 ? 2 : 1;
  const int64_t gs = a.group_size, groups = a.k / gs;
  const int64_t blocks_per_group = gs / kQ8Block;
  const int64_t dstride = a.kp / kQ8Block;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512 neg_zero_point = _mm512_set1_ps(-zero_point);
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
    if (stream) prefetch_l2(t.scales + g * kQ8TileCols, kPrefetchScales);
    const __m512 sv = load_scales<S>(t.scales + g * kQ8TileCols, kQ8TileCols);
    for (int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      __m512i dot[chains][MR];
      for (int c = 0; c < chains; ++c)
        for (int i = 0; i < MR; ++i) dot[c][i] = _mm512_setzero_si512();
      for (int wb = 0; wb < words_per_block; ++wb) {
        const int64_t wi = b * words_per_block + wb;
        const int c = wb % chains;
        if (stream) prefetch_l2(t.words + wi * kQ8TileCols, kPrefetchCodes);
        const __m512i wv = _mm512_loadu_si512(t.words + wi * kQ8TileCols);
        if constexpr (BITS == 4) {
          const __m512i lo = _mm512_and_si512(wv, nib);
          const __m512i hi = high_nibbles(wv);
          // Word wi holds columns 8 wi .. 8 wi + 7 of block wi / 4: evens at pos,
          // odds at pos + 16.
          const int64_t pos = wi / 4 * kQ8Block + (wi % 4) * 4;
          for (int i = 0; i < MR; ++i) {
            dot[c][i] = _mm512_dpbusd_epi32(dot[c][i], lo, _mm512_set1_epi32(load_i32(q[i] + pos)));
            dot[c][i] =
                _mm512_dpbusd_epi32(dot[c][i], hi, _mm512_set1_epi32(load_i32(q[i] + pos + 16)));
          }
        } else {
          for (int i = 0; i < MR; ++i) {
            dot[c][i] =
                _mm512_dpbusd_epi32(dot[c][i], wv, _mm512_set1_epi32(load_i32(q[i] + wi * 4)));
          }
        }
      }
      for (int i = 0; i < MR; ++i) {
        __m512i sum = dot[0][i];
        if constexpr (chains == 2) sum = _mm512_add_epi32(sum, dot[1][i]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                 _mm512_mul_ps(sv, _mm512_set1_ps(d[i][b])), acc[i]);
      }
    }
    const __m512 bv = t.biases ? load_scales<S>(t.biases + g * kQ8TileCols, kQ8TileCols)
                               : _mm512_mul_ps(sv, neg_zero_point);
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xs[i][g]), acc[i]);
  }
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, mask16(cols), acc[i]);
}

constexpr int kGemmRows = 8;

template <int BITS, typename S, int MR = kGemmRows>
VLLM_METAL_INLINE void gemm_rest(const Tile<typename S::storage>& t, const Q8Acts& a, int64_t i,
                                 int rows, int cols, float* y, int64_t ldy, float zero_point,
                                 bool stream) {
  if constexpr (MR > 0) {
    if (rows == MR) return gemm_tile<MR, BITS, S>(t, a, i, cols, y, ldy, zero_point, stream);
    return gemm_rest<BITS, S, MR - 1>(t, a, i, rows, cols, y, ldy, zero_point, stream);
  }
}

// Rows [r0, r1) of a against one tile.
template <int BITS, typename S>
void gemm_rows(const Tile<typename S::storage>& t, const Q8Acts& a, int64_t r0, int64_t r1,
               int cols, float* y, int64_t ldy, float zero_point, bool stream) {
  int64_t i = r0;
  for (; i + kGemmRows <= r1; i += kGemmRows) {
    gemm_tile<kGemmRows, BITS, S>(t, a, i, cols, y + (i - r0) * ldy, ldy, zero_point, stream);
  }
  if (i < r1) {
    gemm_rest<BITS, S>(t, a, i, static_cast<int>(r1 - i), cols, y + (i - r0) * ldy, ldy,
                       zero_point, stream);
  }
}

// --- AMX: 16 rows at a time ----------------------------------------------
//
// One 32-column block of 16 rows against one tile of W is one tdpbsud (A: the
// rows' 32 activation bytes, signed; B: the block's codes as 8 rows of 16 x 4
// bytes, unsigned), the same exact int32 dots as the vpdpbusd chains above.
// The float steps after it are gemm_tile's, in its order, so each output has
// the same bits whichever kernel computes its row (rows past the last multiple
// of 16 take gemm_tile). What AMX saves is the dot products: the 16 x 16 x 32
// products of a block cost one tile instruction against 128 vpdpbusd, leaving
// the three float steps per row and block.

constexpr int kAmxRows = 16;
// One block's codes as a B tile: 8 rows of 64 bytes.
constexpr int kAmxCodeBytes = kQ8Block * kQ8TileCols;
// Rows whose activations a panel keeps in L2 while the call's tiles pass over
// them (W's codes are widened once per tile and panel).
constexpr int64_t kAmxPanelBytes = 1 << 20;

// The palette-1 tile configuration: tmm0 / tmm1 the dots of two blocks in
// flight, tmm2 / tmm4 their activations, tmm3 / tmm5 their codes.
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

AmxConfig amx_config() {
  AmxConfig c;
  for (int t : {0, 1}) {
    c.rows[t] = kAmxRows;
    c.colsb[t] = kQ8TileCols * 4;
  }
  for (int t : {2, 4}) {
    c.rows[t] = kAmxRows;
    c.colsb[t] = kQ8Block;
  }
  for (int t : {3, 5}) {
    c.rows[t] = kQ8Block / 4;
    c.colsb[t] = kQ8TileCols * 4;
  }
  return c;
}

// A tile's codes as B tiles, block after block. For 4 bits, block b's words
// 4b .. 4b + 3 give B rows 0-3 as their low nibbles (the block's even columns)
// and rows 4-7 as their high nibbles (its odd columns), the order q8_position
// gives the activations; 8-bit words are B rows as they stand.
template <int BITS>
void amx_codes(const uint32_t* words, int64_t blocks, bool stream, uint8_t* out) {
  constexpr int words_per_block = kQ8Block * BITS / 32;
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    uint8_t* dst = out + b * kAmxCodeBytes;
    for (int j = 0; j < words_per_block; ++j) {
      const uint32_t* src = words + (b * words_per_block + j) * kQ8TileCols;
      if (stream) prefetch_l2(src, kPrefetchCodes);
      const __m512i wv = _mm512_loadu_si512(src);
      if constexpr (BITS == 4) {
        _mm512_storeu_si512(dst + j * 64, _mm512_and_si512(wv, nib));
        _mm512_storeu_si512(dst + (words_per_block + j) * 64, high_nibbles(wv));
      } else {
        _mm512_storeu_si512(dst + j * 64, wv);
      }
    }
  }
}

// Rows [r0, r0 + 16 n) of a's activations as A tiles, 16 rows by 16 rows and
// block after block ([n][blocks][16][32] bytes): each tile load is then 512
// contiguous bytes, one stream for the prefetcher, where in a's rows it is 16
// lines kp bytes apart (the A loads were the kernel's hottest stall).
void amx_acts(const Q8Acts& a, int64_t r0, int64_t r1, int8_t* out) {
  const int64_t blocks = a.k / kQ8Block;
  for (int64_t r = r0; r < r1; r += kAmxRows) {
    for (int i = 0; i < kAmxRows; ++i) {
      const int8_t* src = a.q.get() + (r + i) * a.kp;
      int8_t* dst = out + (r - r0) * blocks * kQ8Block + i * kQ8Block;
      for (int64_t b = 0; b < blocks; ++b) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + b * kAmxRows * kQ8Block),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + b * kQ8Block)));
      }
    }
  }
}

// Block b's dots of 16 rows (their A tiles from amx_acts) into tile slot b % 2
// (the configuration loaded). Tile numbers are immediates, hence two slots spelled out.
VLLM_METAL_INLINE void amx_issue(const int8_t* acts, const uint8_t* codes, int64_t b) {
  const int8_t* qa = acts + b * kAmxRows * kQ8Block;
  const uint8_t* cb = codes + b * kAmxCodeBytes;
  if (b & 1) {
    _tile_zero(1);
    _tile_loadd(4, qa, kQ8Block);
    _tile_loadd(5, cb, kQ8TileCols * 4);
    _tile_dpbsud(1, 4, 5);
  } else {
    _tile_zero(0);
    _tile_loadd(2, qa, kQ8Block);
    _tile_loadd(3, cb, kQ8TileCols * 4);
    _tile_dpbsud(0, 2, 3);
  }
}

// Rows [i0, i1) of a (a multiple of 16 of them; acts their A tiles) against one
// tile whose codes amx_codes laid out: y[(i - i0) * ldy + j] for j < cols.
template <typename S>
void amx_rows(const Tile<typename S::storage>& t, const uint8_t* codes, const int8_t* acts,
              const Q8Acts& a, int64_t i0, int64_t i1, int cols, float* y, int64_t ldy,
              float zero_point) {
  const int64_t gs = a.group_size, groups = a.k / gs;
  const int64_t blocks_per_group = gs / kQ8Block, blocks = a.k / kQ8Block;
  const int64_t dstride = a.kp / kQ8Block;
  const __m512 neg_zero_point = _mm512_set1_ps(-zero_point);
  alignas(64) int32_t dots[kAmxRows * kQ8TileCols];
  for (int64_t r = i0; r < i1; r += kAmxRows) {
    const int8_t* q = acts + (r - i0) * blocks * kQ8Block;
    const float* d = a.d.get() + r * dstride;
    const float* xs = a.xsum.get() + r * groups;
    __m512 acc[kAmxRows];
    for (auto& v : acc) v = _mm512_setzero_ps();
    amx_issue(q, codes, 0);
    for (int64_t g = 0, b = 0; g < groups; ++g) {
      const __m512 sv = load_scales<S>(t.scales + g * kQ8TileCols, kQ8TileCols);
      for (int64_t end = b + blocks_per_group; b < end; ++b) {
        // The next block multiplies while this one's dots are scaled.
        if (b + 1 < blocks) amx_issue(q, codes, b + 1);
        if (b & 1) {
          _tile_stored(1, dots, kQ8TileCols * 4);
        } else {
          _tile_stored(0, dots, kQ8TileCols * 4);
        }
        for (int i = 0; i < kAmxRows; ++i) {
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(dots + i * kQ8TileCols));
          acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(sv, _mm512_set1_ps(d[i * dstride + b])),
                                   acc[i]);
        }
      }
      const __m512 bv = t.biases ? load_scales<S>(t.biases + g * kQ8TileCols, kQ8TileCols)
                                 : _mm512_mul_ps(sv, neg_zero_point);
      for (int i = 0; i < kAmxRows; ++i) {
        acc[i] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xs[i * groups + g]), acc[i]);
      }
    }
    for (int i = 0; i < kAmxRows; ++i) {
      _mm512_mask_storeu_ps(y + (r - i0 + i) * ldy, mask16(cols), acc[i]);
    }
  }
}

// Each 16-column tile of W's columns [n0, n1): f(tile, scale type, t0, cols,
// in_place). A tiled W's whole tiles are read in place (they follow each other in
// memory, so the kernels' prefetches run ahead into the next one); the rest are
// repacked into scratch with fp32 scales.
template <typename S, typename F>
VLLM_METAL_INLINE void for_tiles(const QuantMatrix& w, int64_t n0, int64_t n1, void* scratch,
                                 F&& f) {
  using ST = typename S::storage;
  const int64_t wpr = w.k * w.bits / 32, groups = w.k / w.group_size;
  for (int64_t t0 = n0; t0 < n1; t0 += kQ8TileCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kQ8TileCols, n1 - t0));
    if (w.tiled && t0 + kQ8TileCols <= w.n) {
      const Tile<ST> t{w.w + t0 * wpr, static_cast<const ST*>(w.scales) + t0 * groups,
                       w.biases ? static_cast<const ST*>(w.biases) + t0 * groups : nullptr};
      f(t, S{}, t0, cols, true);
    } else {
      const Tile<float> t =
          repack<S>(w, t0, static_cast<int>(std::min<int64_t>(kQ8TileCols, w.n - t0)), scratch);
      if (!w.tiled && t0 + kQ8TileCols < n1) prefetch_tile<S>(w, t0 + kQ8TileCols);
      f(t, F32{}, t0, cols, false);
    }
  }
}

// Rows [r0, r1) (a multiple of 16 of them) of the call, by panels of rows.
template <int BITS, typename S>
void gemm_amx(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
              int64_t n1, float* y, int64_t ldy, void* scratch) {
  const int64_t blocks = w.k / kQ8Block;
  const int64_t panel =
      std::max<int64_t>(kAmxRows, kAmxPanelBytes / a.kp / kAmxRows * kAmxRows);
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<int8_t> acts;
  if (codes.size() < static_cast<size_t>(blocks * kAmxCodeBytes)) {
    codes.resize(blocks * kAmxCodeBytes);
  }
  const auto panel_bytes = static_cast<size_t>(std::min(panel, r1 - r0) * blocks * kQ8Block);
  if (acts.size() < panel_bytes) acts.resize(panel_bytes);
  const AmxConfig config = amx_config();
  _tile_loadconfig(&config);
  for (int64_t p0 = r0; p0 < r1; p0 += panel) {
    const int64_t p1 = std::min(r1, p0 + panel);
    amx_acts(a, p0, p1, acts.data());
    for_tiles<S>(w, n0, n1, scratch, [&](const auto& t, auto s, int64_t t0, int cols,
                                         bool in_place) {
      // W streams from memory in the first panel only.
      amx_codes<BITS>(t.words, blocks, in_place && p0 == r0, codes.data());
      amx_rows<decltype(s)>(t, codes.data(), acts.data(), a, p0, p1, cols,
                            y + (p0 - r0) * ldy + (t0 - n0), ldy, w.zero_point);
    });
  }
  // Tile state left configured costs every context switch an 8 KiB save.
  _tile_release();
}

template <int BITS, typename S>
void gemm_bits(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0,
               int64_t n1, float* y, int64_t ldy, void* scratch) {
  if (r1 - r0 >= kQ8AmxMinRows && amx_active()) {
    const int64_t whole = r0 + (r1 - r0) / kAmxRows * kAmxRows;
    gemm_amx<BITS, S>(w, a, r0, whole, n0, n1, y, ldy, scratch);
    y += (whole - r0) * ldy;
    r0 = whole;
    if (r0 == r1) return;
  }
  for_tiles<S>(w, n0, n1, scratch, [&](const auto& t, auto s, int64_t t0, int cols,
                                       bool in_place) {
    gemm_rows<BITS, decltype(s)>(t, a, r0, r1, cols, y + (t0 - n0), ldy, w.zero_point, in_place);
  });
}

void gemm(const QuantMatrix& w, const Q8Acts& a, int64_t r0, int64_t r1, int64_t n0, int64_t n1,
          float* y, int64_t ldy, void* scratch) {
  with_types(w, [&](auto bits, auto s) {
    gemm_bits<decltype(bits)::value, decltype(s)>(w, a, r0, r1, n0, n1, y, ldy, scratch);
  });
}

const Q8Kernels kTable = {quantize_row, gemm};

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
