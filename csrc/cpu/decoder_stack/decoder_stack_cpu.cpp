#include "cpu/decoder_stack/decoder_stack_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cpu/attention/kv_quant_cpu.h"
#include "cpu/decoder_stack/moe_block.h"
#include "cpu/decoder_stack/stack_steps.h"
#include "cpu/lora/lora_cpu.h"
#include "cpu/norm_rope/norm_rope_cpu.h"
#include "cpu/runtime/activations.h"
#include "cpu/runtime/isa.h"
#include "cpu/runtime/scratch.h"
#include "cpu/runtime/thread_pool.h"
#include "cpu/runtime/tile_math.h"

namespace vllm_metal::cpu {

namespace {

using stack::gated;
using stack::linear;

// outs[i] = x @ ls[i].W.T for linears sharing x: quantized ones in one pool job.
template <int N>
void linears(const StackLinear* const (&ls)[N], const float* x, int64_t t, float* const (&outs)[N]) {
  bool quant = true;
  for (const auto* l : ls) quant = quant && l->quant.bits;
  if (!quant) {
    for (int i = 0; i < N; ++i) linear(*ls[i], x, t, outs[i]);
    return;
  }
  QuantMatrix ws[N];
  LinearIO ios[N];
  for (int i = 0; i < N; ++i) {
    ws[i] = ls[i]->quant;
    ios[i] = LinearIO{x, Elem::F32, t, ls[i]->bias, ls[i]->bias_type, outs[i], Elem::F32,
                      ls[i]->int8_activations};
  }
  quantized_matmuls_cpu(ws, ios, N);
}

void norm(const StackNorm& n, const float* x, int64_t rows, int64_t d, float* out) {
  rms_norm_cpu({x, Elem::F32, n.w, n.type, out, Elem::F32, rows, d, n.eps});
}

// RoPE of a layer at the step's positions (t rows of one token each).
RopeArgs rope_args(const StackLayer& l, const int32_t* positions, int64_t t, int head_dim) {
  RopeArgs r{};
  r.type = Elem::F32;
  r.b = t;
  r.l = 1;
  r.d = head_dim;
  r.dims = l.rope_dims;
  r.traditional = l.rope_traditional;
  r.offsets = positions;
  r.num_offsets = t;
  r.freqs = l.rope_freqs;
  r.base = l.rope_base;
  r.scale = l.rope_scale;
  return r;
}

// Same angles: the table of one layer serves another.
bool same_angles(const StackLayer& a, const StackLayer& b) {
  return a.rope_dims == b.rope_dims && a.rope_freqs == b.rope_freqs &&
      a.rope_base == b.rope_base && a.rope_scale == b.rope_scale;
}

// x [t, heads, head_dim] in place, with the angles in `table` ([t, dims / 2] cos, then sin).
void rotate(RopeArgs r, const float* cos, const float* sin, float* x, int heads) {
  r.x = x;
  r.out = x;
  r.m = heads;
  r.cos_table = cos;
  r.sin_table = sin;
  rope_cpu(r);
}

void check_slots(const StackArgs& a) {
  const int64_t slots = static_cast<int64_t>(a.num_blocks) * a.block_size;
  for (size_t g = 0; g < a.slot_mappings.size(); ++g) {
    const int32_t* slot_mapping = a.slot_mappings[g];
    for (int64_t i = 0; i < a.t; ++i) {
      if (slot_mapping[i] >= slots) {
        throw std::out_of_range("decoder_stack: slot_mapping[" + std::to_string(i) + "] = " +
                                std::to_string(slot_mapping[i]) + " (group " +
                                std::to_string(g) + ") is outside the cache's " +
                                std::to_string(slots) + " slots");
      }
    }
  }
}

template <typename T>
void write_cache_as(const StackArgs& a, int layer, const float* k, const float* v) {
  using ST = typename T::storage;
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  auto* kc = static_cast<ST*>(a.key_caches[layer]);
  auto* vc = static_cast<ST*>(a.value_caches[layer]);
  const int32_t* slot_mapping = a.slot_mappings[a.layer_groups[layer]];
  for (int64_t i = 0; i < a.t; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    if (a.key_columns) {
      // Key columns: element j of the row is lane slot % block_size of column j.
      const int64_t off = slot % a.block_size;
      ST* kp = kc + (slot - off) * row + off;
      for (int64_t j = 0; j < row; ++j) {
        kp[j * a.block_size] = T::from_float(k[i * row + j]);
        vc[slot * row + j] = T::from_float(v[i * row + j]);
      }
    } else if constexpr (std::is_same_v<T, F32>) {
      std::memcpy(kc + slot * row, k + i * row, row * sizeof(float));
      std::memcpy(vc + slot * row, v + i * row, row * sizeof(float));
    } else {
      for (int64_t j = 0; j < row; ++j) {
        kc[slot * row + j] = T::from_float(k[i * row + j]);
        vc[slot * row + j] = T::from_float(v[i * row + j]);
      }
    }
  }
}

// Quantized caches: each (token, head) row becomes codes and its scale.
void write_quantized_cache(const StackArgs& a, int layer, const float* k, const float* v) {
  const int64_t row = int64_t(a.num_kv_heads) * a.head_dim;
  const int64_t k_width = int64_t(a.num_kv_heads) * kv_key_width(a.head_dim, a.kv_quant);
  const int64_t v_width = int64_t(a.num_kv_heads) * kv_value_width(a.head_dim, a.kv_quant);
  auto* kc = static_cast<uint8_t*>(a.key_caches[layer]);
  auto* vc = static_cast<uint8_t*>(a.value_caches[layer]);
  const int32_t* slot_mapping = a.slot_mappings[a.layer_groups[layer]];
  for (int64_t i = 0; i < a.t; ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    quantize_token(k + i * row, v + i * row, a.num_kv_heads, a.head_dim, a.kv_quant, kc + slot * k_width,
                   vc + slot * v_width);
  }
}

void write_cache(const StackArgs& a, int layer, const float* k, const float* v) {
  if (a.kv_quant != KvQuant::None) return write_quantized_cache(a, layer, k, v);
  switch (a.kv_type) {
    case Elem::F32:
      return write_cache_as<F32>(a, layer, k, v);
    case Elem::BF16:
      return write_cache_as<BF16>(a, layer, k, v);
    default:
      return write_cache_as<F16>(a, layer, k, v);
  }
}

// g = act(g) * u (cpu/runtime/activations.h), one body compiled per instruction set
// (this file is built for the baseline ISA; see cpu/runtime/isa.h).
template <Activation A>
VLLM_METAL_INLINE void act_mul_span(float* g, const float* u, int64_t n) {
  activation_span<A, true>(g, u, g, n);
}

#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void silu_mul_avx512(float* g, const float* u, int64_t n) {
  act_mul_span<Activation::Silu>(g, u, n);
}
VLLM_METAL_TARGET_AVX2 void silu_mul_avx2(float* g, const float* u, int64_t n) {
  act_mul_span<Activation::Silu>(g, u, n);
}
#endif

void silu_mul_range(float* g, const float* u, int64_t n) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return silu_mul_avx512(g, u, n);
    case Isa::Avx2: return silu_mul_avx2(g, u, n);
    default: break;
  }
#endif
  act_mul_span<Activation::Silu>(g, u, n);
}

#if VLLM_METAL_X86_DISPATCH
VLLM_METAL_TARGET_AVX512 void gelu_mul_avx512(float* g, const float* u, int64_t n, bool erf) {
  erf ? act_mul_span<Activation::Gelu>(g, u, n) : act_mul_span<Activation::GeluTanh>(g, u, n);
}
VLLM_METAL_TARGET_AVX2 void gelu_mul_avx2(float* g, const float* u, int64_t n, bool erf) {
  erf ? act_mul_span<Activation::Gelu>(g, u, n) : act_mul_span<Activation::GeluTanh>(g, u, n);
}
#endif

void gelu_mul_range(float* g, const float* u, int64_t n, bool erf) {
#if VLLM_METAL_X86_DISPATCH
  switch (active_isa()) {
    case Isa::Avx512: return gelu_mul_avx512(g, u, n, erf);
    case Isa::Avx2: return gelu_mul_avx2(g, u, n, erf);
    default: break;
  }
#endif
  erf ? act_mul_span<Activation::Gelu>(g, u, n) : act_mul_span<Activation::GeluTanh>(g, u, n);
}

// h += s * y over n values.
void add_residual(float* h, const float* y, float s, int64_t n) {
  if (s == 1.0f) {
    for (int64_t i = 0; i < n; ++i) h[i] += y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) h[i] += s * y[i];
  }
}

// Adds the LoRA updates of projection p of layer li to its output out
// [t, out_features] (x its input [t, in_features]) in place. `next` walks
// *a.lora, which is ordered as the loop visits projections; `idx` is scratch
// for t slots.
void add_lora(const StackArgs& a, size_t& next, int li, int p, const float* x, float* out,
              int32_t* idx) {
  if (a.lora == nullptr) return;
  const std::vector<StackLora>& sites = *a.lora;
  for (; next < sites.size() && sites[next].layer == li && sites[next].projection == p; ++next) {
    const StackLora& u = sites[next];
    // The rows whose adapter targets this projection keep their slot; a slot
    // outside [-1, num_slots) is kept for lora_cpu to refuse.
    bool any = false;
    for (int64_t r = 0; r < a.t; ++r) {
      const int32_t s = a.lora_rows[r];
      idx[r] = s >= 0 && s < u.num_slots && !u.filled[s] ? -1 : s;
      any = any || idx[r] != -1;
    }
    if (!any) continue;
    LoraArgs l{};
    l.x = x;
    l.idx = idx;
    l.a = u.a;
    l.b = u.b;
    l.b_ld = u.b_ld;
    l.scale = u.scale;
    l.y = out;
    l.out = out;
    l.type = Elem::F32;
    l.weight_type = u.weight_type;
    l.rows = a.t;
    l.in_features = u.in_features;
    l.out_features = u.out_features;
    l.rank = u.rank;
    l.num_slots = u.num_slots;
    l.out_cols = u.out_features;
    l.column_offset = 0;
    l.in_place = true;
    lora_cpu(l);
  }
}

} // namespace

namespace stack {

namespace {

// Elementwise and a small share of a MoE layer's time (the experts' matmuls
// dominate): plain code, the compiler vectorises the clamps.
void swiglu_oai_range(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(g[i], kSwigluOaiLimit);
    const float y = std::clamp(u[i], -kSwigluOaiLimit, kSwigluOaiLimit);
    g[i] = x / (1.0f + std::exp(-kSwigluOaiAlpha * x)) * (y + 1.0f);
  }
}

} // namespace

void linear(const StackLinear& l, const float* x, int64_t t, float* out) {
  LinearIO io{x, Elem::F32, t, l.bias, l.bias_type, out, Elem::F32, l.int8_activations};
  if (l.quant.bits) {
    quantized_matmul_cpu(l.quant, io);
  } else {
    dense_matmul_cpu(l.dense, io);
  }
}

void gated(StackActivation act, float* g, const float* u, int64_t n) {
  constexpr int64_t kParallel = 1 << 16;  // a prefill chunk's MLP, not a decode step's
  parallel_ranges(n, n >= kParallel ? 2 * ThreadPool::instance().size() : 1,
                  [&](int64_t a, int64_t b) {
                    if (act == StackActivation::SwigluOai) {
                      swiglu_oai_range(g + a, u + a, b - a);
                    } else if (act != StackActivation::Silu) {
                      gelu_mul_range(g + a, u + a, b - a, act == StackActivation::Gelu);
                    } else {
                      silu_mul_range(g + a, u + a, b - a);
                    }
                  });
}

} // namespace stack

dispatch::PagedDispatch decoder_stack_cpu(const StackArgs& a) {
  check_slots(a);
  const int64_t t = a.t, hidden = a.hidden;
  const int64_t q_width = static_cast<int64_t>(a.num_heads) * a.head_dim;
  const int64_t kv_width = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  int64_t inter = 0;
  const std::vector<StackLayer>& layers = *a.layers;
  for (const auto& l : layers) inter = std::max(inter, l.gate.out_features());

  // h: the residual stream; scratch sized for the widest layer.
  ScratchVector<float> h(a.x, a.x + t * hidden);
  ScratchVector<float> xn(t * hidden), q(t * q_width), k(t * kv_width), v(t * kv_width),
      attn(t * q_width), gate(t * inter), up(t * inter), tmp(t * hidden);

  PagedAttentionArgs pa{};
  pa.query = q.data();
  pa.query_dtype = mlx::core::float32;
  pa.kv_dtype = a.kv_type == Elem::F32 ? mlx::core::float32
      : a.kv_type == Elem::BF16        ? mlx::core::bfloat16
                                       : mlx::core::float16;
  if (a.kv_quant != KvQuant::None) pa.kv_dtype = mlx::core::uint8;
  pa.kv_quant = a.kv_quant;
  pa.key_columns = a.key_columns;
  pa.seq_lens = a.seq_lens;
  pa.cu_seqlens_q = a.cu_seqlens_q;
  pa.key_ends = a.key_ends;
  pa.sinks = nullptr;
  pa.out = attn.data();
  pa.total_q = static_cast<int>(t);
  pa.num_heads = a.num_heads;
  pa.num_kv_heads = a.num_kv_heads;
  pa.head_size = a.head_dim;
  pa.num_blocks = a.num_blocks;
  pa.block_size = a.block_size;
  pa.num_seqs = a.num_seqs;
  // Layers read the same metadata: check and decide once (again only when a
  // layer's sliding window or KV cache group differs from the last one planned).
  dispatch::PagedDispatch route{};
  int planned_window = -1, planned_group = -1;
  ScratchVector<float> angles;
  const StackLayer* angles_of = nullptr;
  size_t next_lora = 0;
  ScratchVector<int32_t> lora_idx(a.lora != nullptr ? t : 0);
  const int num_layers = static_cast<int>(layers.size());
  const int first = a.begin.layer;
  // Ends mid-layer: hands on the residual stream and this rank's slice of the input
  // of the projection it stops at.
  auto stop = [&](const float* slice, int64_t width) {
    std::memcpy(a.carry_out, slice, sizeof(float) * static_cast<size_t>(t * width));
    std::memcpy(a.out, h.data(), sizeof(float) * static_cast<size_t>(t * hidden));
  };
  for (int li = first; li < num_layers; ++li) {
    const StackLayer& l = layers[li];
    const int group = a.layer_groups[li];
    const bool resume_o = li == first && a.begin.at == kBeforeO;
    const bool resume_down = li == first && a.begin.at == kBeforeDown;
    const float* o_in = resume_o ? a.carry_in : attn.data();
    const float* down_in = resume_down ? a.carry_in : gate.data();
    if (!resume_o && !resume_down) {  // this layer's attention
      if (l.sliding_window != planned_window || group != planned_group) {
        // Before this layer writes its cache.
        pa.sliding_window = l.sliding_window;
        pa.block_tables = a.block_tables[group];
        pa.max_blocks_per_seq = a.max_blocks_per_seq[group];
        route = plan_paged_attention_cpu(pa);
        planned_window = l.sliding_window;
        planned_group = group;
      }
      const float* attn_in = h.data();
      if (l.norms & kPreAttention) {
        norm(l.input_norm, h.data(), t, hidden, xn.data());
        attn_in = xn.data();
      }
      linears<3>({&l.q, &l.k, &l.v}, attn_in, t, {q.data(), k.data(), v.data()});
      add_lora(a, next_lora, li, kQ, attn_in, q.data(), lora_idx.data());
      add_lora(a, next_lora, li, kK, attn_in, k.data(), lora_idx.data());
      add_lora(a, next_lora, li, kV, attn_in, v.data(), lora_idx.data());
      if (l.qk_norm == StackQkNorm::PerHead) {
        norm(l.q_norm, q.data(), t * a.num_heads, a.head_dim, q.data());
        norm(l.k_norm, k.data(), t * a.num_kv_heads, a.head_dim, k.data());
      } else if (l.qk_norm == StackQkNorm::AcrossHeads) {
        norm(l.q_norm, q.data(), t, q_width, q.data());
        norm(l.k_norm, k.data(), t, kv_width, k.data());
      }
      if (l.rope_dims > 0) {
        // Every layer rotates q and k at the same positions: the angles (in
        // double, then cos/sin) are formed once per step, not 2 x layers times.
        const RopeArgs rope = rope_args(l, a.positions, t, a.head_dim);
        const float* cos = a.rope_cos;
        const float* sin = a.rope_sin;
        if (cos == nullptr) {
          if (angles_of == nullptr || !same_angles(*angles_of, l)) {
            angles.resize(2 * t * (l.rope_dims / 2));
            rope_table_cpu(rope, angles.data(), angles.data() + angles.size() / 2);
            angles_of = &l;
          }
          cos = angles.data();
          sin = angles.data() + angles.size() / 2;
        }
        rotate(rope, cos, sin, q.data(), a.num_heads);
        rotate(rope, cos, sin, k.data(), a.num_kv_heads);
      }
      write_cache(a, li, k.data(), v.data());

      pa.key_cache = a.key_caches[li];
      pa.value_cache = a.value_caches[li];
      pa.scale = l.attn_scale;
      pa.softcap = l.softcap;
      pa.sinks = l.sinks;
      run_paged_attention_cpu(pa, route);
      if (li == a.end.layer && a.end.at == kBeforeO) {
        stop(attn.data(), q_width);
        return route;
      }
    }
    if (!resume_down) {  // o, then the MLP up to down's input
      linear(l.o, o_in, t, tmp.data());
      add_lora(a, next_lora, li, kO, o_in, tmp.data(), lora_idx.data());
      if (l.norms & kPostAttention) norm(l.post_attn_norm, tmp.data(), t, hidden, tmp.data());
      add_residual(h.data(), tmp.data(), l.residual_scale, t * hidden);

      const float* mlp_in = h.data();
      if (l.norms & kPreMlp) {
        norm(l.post_norm, h.data(), t, hidden, xn.data());
        mlp_in = xn.data();
      }
      if (l.moe != nullptr) {
        moe_block(*l.moe, l.activation, mlp_in, t, hidden, tmp.data());
      } else {
        const int64_t width = l.gate.out_features();
        linears<2>({&l.gate, &l.up}, mlp_in, t, {gate.data(), up.data()});
        add_lora(a, next_lora, li, kGate, mlp_in, gate.data(), lora_idx.data());
        add_lora(a, next_lora, li, kUp, mlp_in, up.data(), lora_idx.data());
        gated(l.activation, gate.data(), up.data(), t * width);
        if (li == a.end.layer && a.end.at == kBeforeDown) {
          stop(gate.data(), width);
          return route;
        }
      }
    }
    if (l.moe == nullptr) {
      linear(l.down, down_in, t, tmp.data());
      add_lora(a, next_lora, li, kDown, down_in, tmp.data(), lora_idx.data());
    }
    if (l.norms & kPostMlp) norm(l.post_mlp_norm, tmp.data(), t, hidden, tmp.data());
    add_residual(h.data(), tmp.data(), l.residual_scale, t * hidden);
  }
  if (a.final_norm.w != nullptr) {
    norm(a.final_norm, h.data(), t, hidden, a.out);
  } else {  // a pipeline stage before the last: the residual stream goes on as it is
    std::memcpy(a.out, h.data(), sizeof(float) * static_cast<size_t>(t * hidden));
  }
  return route;
}

} // namespace vllm_metal::cpu
