#include "cpu/attention/attention_item.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpu/attention/f16_x86.h"
#include "cpu/runtime/isa.h"
#include "cpu/attention/page_walk.h"
#include "cpu/attention/paged_pieces_cpu.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// The pieces kernel's (decode_row.inc) per-thread buffer of at least n floats
// for an item's scores of one piece.
float* piece_scores(size_t n) {
  thread_local ScratchVector<float> scores;
  if (scores.size() < n) scores.resize(n);
  return scores.data();
}

// dst[0:n] = float(src[0:n]), with the ISA's hardware fp16 conversion if any.
template <typename KV, Isa I>
VLLM_METAL_INLINE void decode_rows(const typename KV::storage* src, float* dst, int64_t n) {
#if VLLM_METAL_X86_DISPATCH
  if constexpr (std::is_same_v<KV, F16> && I == Isa::Avx512) {
    decode_f16_avx512(src, dst, n);
    return;
  } else if constexpr (std::is_same_v<KV, F16> && I == Isa::Avx2) {
    decode_f16_avx2(src, dst, n);
    return;
  }
#endif
  decode_span<KV>(src, dst, n);
}

// Cache elements from one head row to the next: quantized rows end in their
// fp32 scale (kv_quant.h).
template <typename KV>
constexpr int head_stride(int d) {
  return d + (KV::kScaled ? kKvScaleBytes / static_cast<int>(sizeof(typename KV::storage)) : 0);
}

// One head row of d elements into dst as fp32 (quantized: times its scale).
template <typename KV, Isa I>
VLLM_METAL_INLINE void decode_head_row(const typename KV::storage* src, float* dst, int d) {
  if constexpr (KV::kScaled) {
    float scale;
    std::memcpy(&scale, src + d, sizeof(float));
    decode_span<KV>(src, dst, d, scale * KV::kRawScale);
  } else {
    decode_rows<KV, I>(src, dst, d);
  }
}

// Decode the K/V rows of positions [t0, t0 + nk) into fp32 tiles laid out
// head-major [num_kv_heads, tile, d]: the cache is read in address order, and
// each head's keys land contiguous (token rows of all heads are a multiple of
// 4 KiB apart, which would make one head's rows collide in the L1 sets).
template <typename KV, Isa I>
VLLM_METAL_INLINE void gather_tile(const AttentionItem& a, int t0, int nk) {
  using T = typename KV::storage;
  const T* kc = static_cast<const T*>(a.key_cache);
  const T* vc = static_cast<const T*>(a.value_cache);
  const int bs = a.block_size;
  const int d = a.head_size;
  const int hs = head_stride<KV>(d);
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * hs;
  const int64_t tile_stride = static_cast<int64_t>(a.tile) * d;
  int j = 0;
  while (j < nk) {
    const int t = t0 + j;
    const int logical = t / bs;
    const int off = t - logical * bs;
    const int run = std::min(bs - off, nk - j);
    const int32_t block = a.block_table[logical];
    if (block < 0 || block >= a.num_blocks) {
      throw_bad_block(block, logical, a.num_blocks);
    }
    int64_t src = (static_cast<int64_t>(block) * bs + off) * row;
    for (int u = 0; u < run; ++u, ++j, src += row) {
      for (int h = 0; h < a.num_kv_heads; ++h) {
        const int64_t dst = h * tile_stride + static_cast<int64_t>(j) * d;
        decode_head_row<KV, I>(kc + src + h * hs, a.k_tile + dst, d);
        decode_head_row<KV, I>(vc + src + h * hs, a.v_tile + dst, d);
      }
    }
  }
}

// Ask for the K/V lines of positions [t0, t0 + nk) ahead of use: pages sit
// in random order, so the hardware prefetcher cannot guess the next one.
template <typename KV>
VLLM_METAL_INLINE void prefetch_tile(const AttentionItem& a, int t0, int nk) {
  using T = typename KV::storage;
  const char* kc = static_cast<const char*>(a.key_cache);
  const char* vc = static_cast<const char*>(a.value_cache);
  const int bs = a.block_size;
  const int64_t row_bytes = static_cast<int64_t>(a.num_kv_heads) * head_stride<KV>(a.head_size) * sizeof(T);
  int j = 0;
  while (j < nk) {
    const int t = t0 + j;
    const int logical = t / bs;
    const int off = t - logical * bs;
    const int run = std::min(bs - off, nk - j);
    const int32_t block = a.block_table[logical];
    if (block >= 0 && block < a.num_blocks) {
      const int64_t start = (static_cast<int64_t>(block) * bs + off) * row_bytes;
      for (int64_t b = 0; b < run * row_bytes; b += 64) {
        __builtin_prefetch(kc + start + b, 0, 3);
        __builtin_prefetch(vc + start + b, 0, 3);
      }
    }
    j += run;
  }
}

template <typename KV, int D, Isa I>
VLLM_METAL_INLINE void attention_item_body(const AttentionItem& a) {
  const int d = D ? D : a.head_size;
  const int num_heads = a.num_kv_heads * a.group;
  const int nq = a.rows * num_heads;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < nq; ++i) {
    a.m[i] = neg_inf;
    a.l[i] = 0.0f;
  }
  std::memset(a.acc, 0, sizeof(float) * static_cast<size_t>(nq) * d);

  int lo = std::numeric_limits<int>::max();
  int hi = std::numeric_limits<int>::min();
  for (int r = 0; r < a.rows; ++r) {
    if (a.row_lo[r] < a.row_hi[r]) {
      lo = std::min(lo, a.row_lo[r]);
      hi = std::max(hi, a.row_hi[r]);
    }
  }

  for (int t0 = lo; t0 < hi; t0 += a.tile) {
    const int nk = std::min(a.tile, hi - t0);
    gather_tile<KV, I>(a, t0, nk);
    if (t0 + a.tile < hi) {
      prefetch_tile<KV>(a, t0 + a.tile, std::min(a.tile, hi - t0 - a.tile));
    }
    for (int r = 0; r < a.rows; ++r) {
      // Causal / sliding-window mask as a contiguous range of this tile.
      const int ja = std::max(a.row_lo[r] - t0, 0);
      const int jb = std::min(a.row_hi[r] - t0, nk);
      if (ja >= jb) continue;
      const int n = jb - ja;
      const int n16 = (n + kLanes - 1) / kLanes * kLanes;
      for (int h = 0; h < a.num_kv_heads; ++h) {
        const int64_t first = (static_cast<int64_t>(h) * a.tile + ja) * d;
        const float* k = a.k_tile + first;
        const float* v = a.v_tile + first;
        for (int g = 0; g < a.group; ++g) {
          const int i = r * num_heads + h * a.group + g;
          float* acc = a.acc + static_cast<int64_t>(i) * d;
          dot_rows<D>(a.q + static_cast<int64_t>(i) * d, k, d, n, a.scores, d);
          if (a.softcap > 0.0f) {
            for (int j = 0; j < n; ++j) {
              a.scores[j] = a.softcap * std::tanh(a.scores[j] / a.softcap) * kLog2e;
            }
          }
          for (int j = n; j < n16; ++j) a.scores[j] = neg_inf;
          const float m_new = std::max(a.m[i], max_padded(a.scores, n16));
          if (m_new > a.m[i] && a.m[i] != neg_inf) {
            const float alpha = exp2_nonpositive(a.m[i] - m_new);
            a.l[i] *= alpha;
            scale_row<D>(acc, alpha, d);
          }
          a.m[i] = m_new;
          a.l[i] += exp2_shifted_padded(a.scores, n16, m_new);
          accumulate_rows<D>(a.scores, v, d, n, acc, d);
        }
      }
    }
  }
}

// The portable single-row kernel (generic ISA, or head sizes without an
// intrinsics kernel): one query row over keys [row_lo[0], row_hi[0]), page run
// by page run straight from the cache; a run's K/V rows (<= one page, all KV
// heads) stay in L1 while every query head of each group reads them, and the
// next run is prefetched meanwhile. fp32 caches are read in place; fp16 /
// bf16 runs are decoded once into the item's tiles.
template <typename KV, int D, Isa I>
VLLM_METAL_INLINE void decode_item_body(const AttentionItem& a) {
  using T = typename KV::storage;
  constexpr bool kInPlace = std::is_same_v<KV, F32>;
  const int d = D ? D : a.head_size;
  const int num_heads = a.num_kv_heads * a.group;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < num_heads; ++i) {
    a.m[i] = neg_inf;
    a.l[i] = 0.0f;
  }
  std::memset(a.acc, 0, sizeof(float) * static_cast<size_t>(num_heads) * d);
  const int lo = a.row_lo[0];
  const int hi = a.row_hi[0];
  if (lo >= hi) return;
  const T* kc = static_cast<const T*>(a.key_cache);
  const T* vc = static_cast<const T*>(a.value_cache);
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * d;
  const int limit = std::min(a.block_size, a.tile); // scores holds `tile` keys

  RunPrefetcher pf;
  int64_t first = 0;
  int n = page_run(a, lo, hi, limit, row, &first);
  for (int t = lo; t < hi;) {
    const int t_next = t + n;
    int64_t next_first = 0;
    int n_next = 0;
    if (t_next < hi) n_next = page_run(a, t_next, hi, limit, row, &next_first);
    pf.start(kc + next_first, vc + next_first, n_next * row * static_cast<int64_t>(sizeof(T)), num_heads);
    const float* k;
    const float* v;
    if constexpr (kInPlace) {
      k = kc + first;
      v = vc + first;
    } else {
      decode_rows<KV, I>(kc + first, a.k_tile, n * row);
      decode_rows<KV, I>(vc + first, a.v_tile, n * row);
      k = a.k_tile;
      v = a.v_tile;
    }
    const int n16 = (n + kLanes - 1) / kLanes * kLanes;
    for (int h = 0; h < a.num_kv_heads; ++h) {
      for (int g = 0; g < a.group; ++g) {
        const int i = h * a.group + g;
        float* acc = a.acc + static_cast<int64_t>(i) * d;
        pf.tick();
        dot_rows<D>(a.q + static_cast<int64_t>(i) * d, k + h * d, row, n, a.scores, d);
        if (a.softcap > 0.0f) {
          for (int j = 0; j < n; ++j) {
            a.scores[j] = a.softcap * std::tanh(a.scores[j] / a.softcap) * kLog2e;
          }
        }
        for (int j = n; j < n16; ++j) a.scores[j] = neg_inf;
        const float m_new = std::max(a.m[i], max_padded(a.scores, n16));
        if (m_new > a.m[i] && a.m[i] != neg_inf) {
          const float alpha = exp2_nonpositive(a.m[i] - m_new);
          a.l[i] *= alpha;
          scale_row<D>(acc, alpha, d);
        }
        a.m[i] = m_new;
        a.l[i] += exp2_shifted_padded(a.scores, n16, m_new);
        accumulate_rows<D>(a.scores, v + h * d, row, n, acc, d);
      }
    }
    t = t_next;
    n = n_next;
    first = next_first;
  }
}

// One symbol per (ISA, dtype, head size): `flatten` inlines the whole body into
// each, compiled for that ISA only, so no wide instruction leaks into shared
// code and ISA-specific helpers (F16C) inline too.
template <typename KV, int D>
__attribute__((flatten)) void item_generic(const AttentionItem& a) {
  attention_item_body<KV, D, Isa::Generic>(a);
}

#if VLLM_METAL_X86_DISPATCH
template <typename KV, int D>
VLLM_METAL_TARGET_AVX2 __attribute__((flatten)) void item_avx2(const AttentionItem& a) {
  attention_item_body<KV, D, Isa::Avx2>(a);
}

template <typename KV, int D>
VLLM_METAL_TARGET_AVX512 __attribute__((flatten)) void item_avx512(const AttentionItem& a) {
  attention_item_body<KV, D, Isa::Avx512>(a);
}
#endif

} // namespace

// The intrinsics decode kernel per x86 ISA: everything between push and pop is
// built for that ISA only, and the namespaces keep the copies apart.
#if VLLM_METAL_X86_DISPATCH
#if defined(__clang__)
#pragma clang attribute push(                                                   \
    __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")
#endif
namespace avx512_attention {
namespace {
#include "cpu/attention/attention_avx512.inc"
#include "cpu/attention/decode_row.inc"
} // namespace
} // namespace avx512_attention
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2_attention {
namespace {
#include "cpu/attention/attention_avx2.inc"
#include "cpu/attention/decode_row.inc"
} // namespace
} // namespace avx2_attention
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace generic_attention {
namespace {
#include "cpu/attention/attention_generic.inc"
#include "cpu/attention/decode_row.inc"
} // namespace
} // namespace generic_attention

namespace {

template <typename KV, int D>
__attribute__((flatten)) void decode_generic(const AttentionItem& a) {
  decode_item_body<KV, D, Isa::Generic>(a);
}

#if VLLM_METAL_X86_DISPATCH
template <typename KV, int D>
VLLM_METAL_TARGET_AVX2 __attribute__((flatten)) void decode_avx2(const AttentionItem& a) {
  decode_item_body<KV, D, Isa::Avx2>(a);
}

template <typename KV, int D>
VLLM_METAL_TARGET_AVX512 __attribute__((flatten)) void decode_avx512(const AttentionItem& a) {
  decode_item_body<KV, D, Isa::Avx512>(a);
}
#endif

template <typename KV, int D>
AttentionItemFn for_isa(Isa isa, bool decode, bool pieces) {
  if constexpr (KV::kScaled) {
    // Quantized caches: the pieces kernel, else the tile kernel for every row
    // count (the single-row kernel decodes whole token rows, which
    // per-head-row scales break up).
#if VLLM_METAL_X86_DISPATCH
    if constexpr (D != 0) {
      if (pieces && isa == Isa::Avx512) return &avx512_attention::DecodeRow<KV, D>::run;
      if (pieces && isa == Isa::Avx2) return &avx2_attention::DecodeRow<KV, D>::run;
    }
    if (isa == Isa::Avx512 && !pieces) return &item_avx512<KV, D>;
    if (isa == Isa::Avx2 && !pieces) return &item_avx2<KV, D>;
#endif
    if constexpr (D != 0) {
      if (pieces) return &generic_attention::DecodeRow<KV, D>::run;
    }
    return pieces ? nullptr : &item_generic<KV, D>;
  } else {
#if VLLM_METAL_X86_DISPATCH
  if constexpr (D != 0) {
    if (pieces && isa == Isa::Avx512) return &avx512_attention::DecodeRow<KV, D>::run;
    if (pieces && isa == Isa::Avx2) return &avx2_attention::DecodeRow<KV, D>::run;
  }
  if (isa == Isa::Avx512 && !pieces) return decode ? &decode_avx512<KV, D> : &item_avx512<KV, D>;
  if (isa == Isa::Avx2 && !pieces) return decode ? &decode_avx2<KV, D> : &item_avx2<KV, D>;
#endif
  if constexpr (D != 0) {
    if (pieces) return &generic_attention::DecodeRow<KV, D>::run;
  }
  if (pieces) return nullptr; // other head sizes: the older plan, not batch-invariant
  return decode ? &decode_generic<KV, D> : &item_generic<KV, D>;
  }
}

template <typename KV>
AttentionItemFn for_head_size(Isa isa, int head_size, bool decode, bool pieces) {
  switch (head_size) {
    case 64:
      return for_isa<KV, 64>(isa, decode, pieces);
    case 128:
      return for_isa<KV, 128>(isa, decode, pieces);
    case 256:
      return for_isa<KV, 256>(isa, decode, pieces);
    default:
      return for_isa<KV, 0>(isa, decode, pieces);
  }
}

// Caches with 4-bit rows (Rot4, K8V4's values): the pieces kernel only (it
// widens those rows whole; the other kernels' element decoders do not read them).
template <typename KV, int D>
AttentionItemFn pieces_only(Isa isa) {
#if VLLM_METAL_X86_DISPATCH
  if (isa == Isa::Avx512) return &avx512_attention::DecodeRow<KV, D>::run;
  if (isa == Isa::Avx2) return &avx2_attention::DecodeRow<KV, D>::run;
#endif
  return &generic_attention::DecodeRow<KV, D>::run;
}

template <typename KV>
AttentionItemFn pieces_only(Isa isa, int head_size, bool pieces) {
  if (pieces && head_size == 64) return pieces_only<KV, 64>(isa);
  if (pieces && head_size == 128) return pieces_only<KV, 128>(isa);
  if (pieces && head_size == 256) return pieces_only<KV, 256>(isa);
  throw std::invalid_argument("paged_attention: a cache of 4-bit rows is read by the pieces kernel only "
                              "(head sizes 64, 128, 256), got head size " + std::to_string(head_size));
}

AttentionItemFn select(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size, bool decode, bool pieces) {
  const Isa isa = active_isa();
  if (quant != KvQuant::None && kv_dtype != mlx::core::uint8) {
    throw std::invalid_argument("paged_attention: a quantized cache must be uint8");
  }
  switch (quant) {
    case KvQuant::Int8:
      return for_head_size<I8>(isa, head_size, decode, pieces);
    case KvQuant::Fp8E4M3:
      return for_head_size<E4M3>(isa, head_size, decode, pieces);
    case KvQuant::Fp8E5M2:
      return for_head_size<E5M2>(isa, head_size, decode, pieces);
    case KvQuant::Rot4:
      return pieces_only<R4>(isa, head_size, pieces);
    case KvQuant::K8V4:
      return pieces_only<K8V4>(isa, head_size, pieces);
    case KvQuant::None:
      break;
  }
  switch (kv_dtype) {
    case mlx::core::float32:
      return for_head_size<F32>(isa, head_size, decode, pieces);
    case mlx::core::float16:
      return for_head_size<F16>(isa, head_size, decode, pieces);
    case mlx::core::bfloat16:
      return for_head_size<BF16>(isa, head_size, decode, pieces);
    default:
      throw std::invalid_argument(
          "paged_attention: cache dtype must be float16, bfloat16 or float32");
  }
}

} // namespace

int attention_tile_keys(int num_kv_heads, int head_size) {
  const int row = std::max(num_kv_heads * head_size, 1);
  return std::clamp(32768 / row, 8, 64);
}

[[noreturn]] __attribute__((noinline, cold)) void throw_bad_block(int32_t block, int logical_block, int num_blocks) {
  throw std::out_of_range(
      "paged_attention: block_tables entry " + std::to_string(block) + " (logical block " +
      std::to_string(logical_block) + ") is outside the cache's " + std::to_string(num_blocks) + " blocks");
}

AttentionItemFn select_attention_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size) {
  return select(kv_dtype, quant, head_size, false, false);
}

AttentionItemFn select_decode_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size) {
  return select(kv_dtype, quant, head_size, true, false);
}

AttentionItemFn select_pieces_item(mlx::core::Dtype kv_dtype, KvQuant quant, int head_size) {
  return select(kv_dtype, quant, head_size, false, true);
}

} // namespace vllm_metal::cpu
