// The gated delta rule of Gated DeltaNet layers (gdn_cpu.h has the maths).
// Items are (request, value head): a head's [Dv, Dk] state is updated in
// place in its page, token by token, one pass over each state row for the
// decay and S k, a second for the update and S q (SIMD over Dk); without the
// delta rule there is no S k, so one pass does all three. With a chunk size
// (and scalar gates) the items run the chunked form instead (gdn_chunked.h),
// but for a last chunk of fewer than kGdnChunkMinRows rows.
#include <algorithm>
#include <vector>

#include "cpu/gdn/gdn_chunked.h"
#include "cpu/gdn/gdn_cpu.h"
#include "cpu/linear/linear_driver.h"
#include "cpu/runtime/isa.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

struct Item {
  int seq;
  int head;
  int64_t rows;
};

// Rows [r0, r1) of value head `head`, from and into its state.
struct Span {
  int head;
  int64_t r0, r1;
  float* state;
};

struct DeltaScratch {
  ScratchVector<float> q, k, g;  // [Dk]: this token's query, key and decay
  ScratchVector<float> v, y;     // [Dv]
};

// s[0:d] *= g[0:d]; returns s . k. Sixteen partial sums (tile_math.h says why).
template <int D>
VLLM_METAL_INLINE float decay_dot(float* __restrict s, const float* __restrict g,
                                  const float* __restrict k, int d) {
  const int n = D ? D : d;
  const int n16 = n - n % kLanes;
  float p[kLanes] = {};
  for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      s[c + l] *= g[c + l];
      p[l] += s[c + l] * k[c + l];
    }
  }
  for (int c = n16; c < n; ++c) {
    s[c] *= g[c];
    p[0] += s[c] * k[c];
  }
  return tree_sum(p);
}

// s[0:d] += delta * k[0:d]; returns s . q.
template <int D>
VLLM_METAL_INLINE float update_dot(float* __restrict s, float delta, const float* __restrict k,
                                   const float* __restrict q, int d) {
  const int n = D ? D : d;
  const int n16 = n - n % kLanes;
  float p[kLanes] = {};
  for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      s[c + l] += delta * k[c + l];
      p[l] += s[c + l] * q[c + l];
    }
  }
  for (int c = n16; c < n; ++c) {
    s[c] += delta * k[c];
    p[0] += s[c] * q[c];
  }
  return tree_sum(p);
}

// Without the delta rule: s[0:d] = s * g + delta * k; returns s . q (one pass).
template <int D>
VLLM_METAL_INLINE float decay_update_dot(float* __restrict s, const float* __restrict g,
                                         float delta, const float* __restrict k,
                                         const float* __restrict q, int d) {
  const int n = D ? D : d;
  const int n16 = n - n % kLanes;
  float p[kLanes] = {};
  for (int c = 0; c < n16; c += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      s[c + l] = s[c + l] * g[c + l] + delta * k[c + l];
      p[l] += s[c + l] * q[c + l];
    }
  }
  for (int c = n16; c < n; ++c) {
    s[c] = s[c] * g[c] + delta * k[c];
    p[0] += s[c] * q[c];
  }
  return tree_sum(p);
}

template <int D>
VLLM_METAL_INLINE void delta_body(const GatedDeltaArgs& a, const Span& sp, DeltaScratch& w) {
  const int dk = D ? D : a.head_k_dim, dv = a.head_v_dim;
  const int hv = a.num_v_heads, hk = a.num_k_heads, h = sp.head;
  const int kh = h / (hv / hk);
  float* state = sp.state;
  w.q.resize(dk);
  w.k.resize(dk);
  w.g.resize(dk);
  w.v.resize(dv);
  w.y.resize(dv);
  for (int64_t t = sp.r0; t < sp.r1; ++t) {
    const int64_t key_row = (t * hk + kh) * dk, head = t * hv + h;
    driver::load_row(a.q, a.q_type, key_row, dk, w.q.data());
    driver::load_row(a.k, a.k_type, key_row, dk, w.k.data());
    driver::load_row(a.v, a.v_type, head * dv, dv, w.v.data());
    if (a.vector_gate) {
      driver::load_row(a.g, a.g_type, head * dk, dk, w.g.data());
    } else {
      float gate;
      driver::load_row(a.g, a.g_type, head, 1, &gate);
      std::fill(w.g.begin(), w.g.end(), gate);
    }
    float beta;
    driver::load_row(a.beta, a.beta_type, head, 1, &beta);
    for (int i = 0; i < dv; ++i) {
      float* s = state + static_cast<int64_t>(i) * dk;
      if (a.delta_rule) {
        const float delta = (w.v[i] - decay_dot<D>(s, w.g.data(), w.k.data(), dk)) * beta;
        w.y[i] = update_dot<D>(s, delta, w.k.data(), w.q.data(), dk);
      } else {
        w.y[i] = decay_update_dot<D>(s, w.g.data(), w.v[i] * beta, w.k.data(), w.q.data(), dk);
      }
    }
    driver::store_row(w.y.data(), nullptr, dv, a.y, a.y_type, head * dv);
  }
}

// Dk = 128 (Qwen3-Next, Qwen3.5) with the trip counts known.
VLLM_METAL_INLINE void delta_rows(const GatedDeltaArgs& a, const Span& sp, DeltaScratch& w) {
  if (a.head_k_dim == 128) return delta_body<128>(a, sp, w);
  delta_body<0>(a, sp, w);
}

void delta_generic(const GatedDeltaArgs& a, const Span& sp, DeltaScratch& w) {
  delta_rows(a, sp, w);
}
#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void delta_avx512(const GatedDeltaArgs& a, const Span& sp,
                                           DeltaScratch& w) {
  delta_rows(a, sp, w);
}
VLLM_METAL_TARGET_AVX2 void delta_avx2(const GatedDeltaArgs& a, const Span& sp, DeltaScratch& w) {
  delta_rows(a, sp, w);
}
#endif

void token_by_token(const GatedDeltaArgs& a, const Span& sp, DeltaScratch& w) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return delta_avx512(a, sp, w);
    case Isa::Avx2: return delta_avx2(a, sp, w);
    default: break;
  }
#endif
  delta_generic(a, sp, w);
}

// Request it.seq's rows for head it.head: chunks of a.chunk rows from its first
// row (with chunked), and token by token the rest, a last chunk too short to pay
// for the chunked form's matrix products (kGdnChunkMinRows).
void run_item(const GatedDeltaArgs& a, const Item& it, bool chunked,
              const GdnChunkKernels& kernels) {
  const int64_t r0 = a.batch.cu_seqlens[it.seq], r1 = a.batch.cu_seqlens[it.seq + 1];
  float* state = gdn_head_state(a, a.batch.slots[it.seq], it.head);
  if (a.batch.has_state[it.seq] == 0) {
    std::fill(state, state + static_cast<int64_t>(a.head_v_dim) * a.head_k_dim, 0.0f);
  }
  int64_t split = r0;
  if (chunked) {
    const int64_t tail = (r1 - r0) % a.chunk;
    split = tail < kGdnChunkMinRows ? r1 - tail : r1;
  }
  if (split > r0) {
    thread_local ChunkScratch w;
    kernels.rows(a, it.head, r0, split, state, w);
  }
  if (r1 > split) {
    thread_local DeltaScratch w;
    token_by_token(a, {it.head, split, r1, state}, w);
  }
}

} // namespace

void gated_delta_cpu(const GatedDeltaArgs& a) {
  check_gdn_batch("gdn_gated_delta", a.batch);
  std::vector<Item> items;
  for (int n = 0; n < a.batch.num_seqs; ++n) {
    const int64_t rows = a.batch.cu_seqlens[n + 1] - a.batch.cu_seqlens[n];
    for (int h = 0; h < a.num_v_heads; ++h) items.push_back({n, h, rows});
  }
  // Longest first: the last items to start are the short ones.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.rows > y.rows; });
  // A vector gate has no chunked form here: those heads keep the recurrence.
  const bool chunked = a.chunk > 0 && !a.vector_gate;
  const GdnChunkKernels& kernels = gdn_chunk_kernels();
  ThreadPool::instance().parallel_for(static_cast<int>(items.size()), [&](int i) {
    run_item(a, items[i], chunked, kernels);
  });
}

} // namespace vllm_metal::cpu
