// Python bindings of the vllm-metal extension (imported only via
// vllm_metal.native.get_ops()). The module holds what production calls: the ops
// and the facts the loader, the memory budget and the logs read; test,
// benchmark and diagnostic hooks live in its `debug` submodule.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include "constants.h"
#include "cpu/linear/linear_q8.h"
#include "cpu/runtime/scratch.h"
#include "debug.h"
#include "host_info.h"
#include "dispatch/dispatch_bindings.h"
#include "dispatch/experts_bindings.h"
#include "dispatch/mla_bindings.h"
#include "dispatch/gdn_bindings.h"
#include "dispatch/lora_bindings.h"
#include "ops/paged_attention.h"
#include "ops/reshape_and_cache.h"
#include "ops/quantized_matmul.h"
#include "ops/dense_matmul.h"
#include "ops/expert_matmul.h"
#include "ops/mla.h"
#include "ops/gdn.h"
#include "ops/embedding_gather.h"
#include "ops/activation.h"
#include "ops/rms_norm.h"
#include "ops/sample_tokens.h"
#include "ops/top_logprobs.h"
#include "cpu/sampling/sample_cpu.h"
#include "ops/rope.h"
#include "ops/decoder_stack.h"
#include "ops/eval_layout.h"
#include "ops/lora_matmul.h"
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_ext, m) {
  m.doc() = "vllm-metal native ops as MLX primitives (hooks for tests and diagnostics: .debug)";

  m.attr("PARTITION_SIZE") = vllm_metal::kPartitionSize;
  nb::list block_sizes;
  for (int b : vllm_metal::kKernelBlockSizes) block_sizes.append(b);
  m.attr("KERNEL_BLOCK_SIZES") = nb::steal(PySequence_Tuple(block_sizes.ptr()));
  m.attr("mlx_build_version") = vllm_metal::kMlxBuildVersion;

  m.def(
      "reshape_and_cache",
      &vllm_metal::reshape_and_cache,
      "key"_a,
      "value"_a,
      "key_cache"_a,
      "value_cache"_a,
      "slot_mapping"_a,
      nb::kw_only(),
      "kv_quant"_a = 0,
      "key_columns"_a = false,
      "stream"_a = nb::none(),
      R"(Write K/V rows [num_tokens, num_kv_heads, head_size] into paged caches
[num_blocks, block_size, num_kv_heads, head_size] at slot_mapping [num_tokens]
(negative = skip). Returns (key_cache, value_cache); they share the input
caches' buffers, so the write is in place. kv_quant 1/2/3 (int8, fp8 e4m3,
fp8 e5m2): uint8 caches [..., head_size + 4], each row codes then fp32 scale.
key_columns (float caches, CPU): key_cache [num_blocks, num_kv_heads,
head_size, block_size].)");

  m.def(
      "paged_attention",
      &vllm_metal::paged_attention,
      "query"_a,
      "key_cache"_a,
      "value_cache"_a,
      "block_tables"_a,
      "seq_lens"_a,
      "cu_seqlens_q"_a,
      "scale"_a,
      "sliding_window"_a = nb::none(),
      "softcap"_a = nb::none(),
      "sinks"_a = nb::none(),
      nb::kw_only(),
      "kv_quant"_a = 0,
      "key_columns"_a = false,
      "key_ends"_a = nb::none(),
      "stream"_a = nb::none(),
      R"(Varlen causal attention through block tables. query [total_q, num_heads,
head_size]; caches [num_blocks, block_size, num_kv_heads, head_size] (kv_quant
1/2/3: uint8 [..., head_size + 4] as reshape_and_cache writes them);
block_tables int32 [num_seqs, max_blocks]; seq_lens int32 [num_seqs];
cu_seqlens_q int32 [num_seqs + 1]; sinks float [num_heads] or None;
key_columns (float caches at head sizes 64/128/256, CPU): key_cache
[num_blocks, num_kv_heads, head_size, block_size]; key_ends int32 [total_q]
or None: a row also attends to the keys after it up to its entry (capped at
its context: bidirectional spans).
Returns [total_q, num_heads, head_size] in query's dtype.)");

  m.def(
      "quantized_matmul",
      &vllm_metal::quantized_matmul,
      "x"_a,
      "w"_a,
      "scales"_a,
      "biases"_a.none(),
      "bits"_a,
      "group_size"_a,
      "bias"_a = nb::none(),
      nb::kw_only(),
      "int8_activations"_a = false,
      "zero_point"_a = 0.0f,
      "argmax_columns"_a = 0,
      "argmax_allowed"_a = nb::none(),
      "tiled"_a = false,
      "stream"_a = nb::none(),
      R"(x [..., K] @ W.T for an MLX affine-quantized W: w uint32 [N, K * bits / 32],
scales/biases [N, K / group_size] (W = scale * q + bias); bias optional [N].
bits 4 or 8, group_size 32/64/128. Returns [..., N] (fp32 accumulation) in
MLX's promotion of the x, scales and bias dtypes. int8_activations: x is
rounded to int8 per 32 columns and the products are integer dot products.
biases=None (only with int8_activations): symmetric weights whose biases are
-zero_point * scale, formed from the scales instead of read. argmax_columns > 0
(float32 results only): returns int32 [...], each row's argmax over its first
argmax_columns products (first NaN, else first maximum, as mx.argmax).
argmax_allowed (with argmax_columns): uint32 [..., >= ceil(argmax_columns / 32)],
a grammar bitmask (bit c % 32 of word c / 32 admits column c); the columns it
does not admit count as -inf. tiled (with int8_activations): w, scales and
biases are in the int8 kernels' tile order (vllm_metal.ops.linear.tile_quantized).)");

  m.def(
      "dense_matmul",
      &vllm_metal::dense_matmul,
      "x"_a,
      "w"_a,
      "bias"_a = nb::none(),
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(x [..., K] @ w.T for w float32/bfloat16/float16 [N, K]; bias optional [N].
Returns [..., N] (fp32 accumulation) in MLX's promotion of the x, w and bias
dtypes.)");

  m.def(
      "expert_matmul",
      &vllm_metal::expert_matmul,
      "x"_a,
      "idx"_a,
      "w"_a,
      "scales"_a = nb::none(),
      "biases"_a = nb::none(),
      "bits"_a = 0,
      "group_size"_a = 0,
      "bias"_a = nb::none(),
      nb::kw_only(),
      "mode"_a = "affine",
      "int8_activations"_a = false,
      "tiled"_a = false,
      "stream"_a = nb::none(),
      R"(Mixture-of-experts products: out[p] = x[p / (P / R)] @ W[idx[p]].T (+ bias[idx[p]]).
x [R, K] float (R divides P); idx int32/uint32 [P] in [0, E); w float [E, N, K]
(bits 0) or uint32 [E, N, K * bits / 32] with scales/biases [E, N, K / group_size]
(bits 4/8, MLX affine), or mode "mxfp4" (bits 4, group_size 32): FP4 codes with
uint8 E8M0 scales [E, N, K / 32] and biases None; bias optional [E, N]. Returns
[P, N] (fp32 accumulation)
in MLX's promotion of the x, weight (scales) and bias dtypes. Pairs are grouped by
expert: each touched expert is read once. An idx outside [0, E) raises at
evaluation. int8_activations (affine, CPU): x rounded to int8 per 32 columns, as
quantized_matmul; tiled: each expert's arrays in the int8 kernels' tile order.)");

  m.def(
      "latent_cache_write",
      &vllm_metal::latent_cache_write,
      "latent"_a,
      "k_pe"_a,
      "cache"_a,
      "slot_mapping"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Store each token's [latent (rank), k_pe (rope_dim)] row in its paged slot of
cache [num_blocks, block_size, rank + rope_dim] (MLA's latent cache), in place;
returns the cache. Negative slots are skipped; a slot past the cache raises at
evaluation.)");

  m.def(
      "mla_attention",
      &vllm_metal::mla_attention,
      "q_latent"_a,
      "q_pe"_a,
      "cache"_a,
      "block_tables"_a,
      "seq_lens"_a,
      "cu_seqlens_q"_a,
      "scale"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Weight-absorbed multi-head latent attention over a paged latent cache:
q_latent [T, H, rank], q_pe [T, H, rope_dim] -> [T, H, rank] = softmax(scale *
(q_latent . c + q_pe . k_pe)) @ c over each sequence's tokens up to the row's
position; cache [num_blocks, block_size, rank + rope_dim]; block_tables [S, B],
seq_lens [S], cu_seqlens_q [S + 1] as paged_attention.)");

  m.def(
      "gdn_short_conv",
      &vllm_metal::gdn_short_conv,
      "x"_a,
      "weight"_a,
      "lo"_a,
      "slots"_a,
      "cu_seqlens"_a,
      "has_state"_a,
      "conv_offset"_a = 0,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Gated DeltaNet's causal depthwise conv over a packed batch: x [T, C], weight
[C, K] -> (y [T, C] in x's dtype, lo), y[t] = sum_j weight[:, j] * z[t + j] with
z = [state; the request's rows], no activation. Request n (rows cu_seqlens[n] to
cu_seqlens[n + 1]) continues from its last K - 1 inputs, [K - 1, C] float32 at
lo[slots[n], conv_offset:] (zeros where has_state[n] is 0), and leaves its new ones
there, in place (lo [num_blocks, W] float32). Slots outside the pages or named twice
raise at evaluation.)");

  m.def(
      "gdn_gated_delta",
      &vllm_metal::gdn_gated_delta,
      "q"_a,
      "k"_a,
      "v"_a,
      "g"_a,
      "beta"_a,
      "lo"_a,
      "hi"_a,
      "slots"_a,
      "cu_seqlens"_a,
      "has_state"_a,
      "ssm_offset"_a,
      "heads_in_lo"_a,
      "delta_rule"_a = true,
      "chunk"_a = 0,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Gated DeltaNet's gated delta rule over a packed batch: q, k [T, Hk, Dk],
v [T, Hv, Dv] (value head h reads key head h / (Hv / Hk)), g [T, Hv] or
[T, Hv, Dk], beta [T, Hv] -> (y [T, Hv, Dv] in q's dtype, lo, hi). Per token and
head, on its [Dv, Dk] float32 state S: S = S * g; S += outer(beta * (v - S k), k);
y = S q; with delta_rule false, S += beta * outer(v, k) instead (Mamba2's gated
linear attention). chunk 0 runs token by token; 32 or 64 (scalar g only) runs the
chunked form in chunks of that many rows from each request's first row (a last chunk
under 8 rows token by token): equal up to rounding, which then depends on where the
chunks start. Head h's state is at lo[slot, ssm_offset + h * Dv * Dk] for h <
heads_in_lo, else at hi[slot, (h - heads_in_lo) * Dv * Dk], and is updated in
place; slots, cu_seqlens and has_state as gdn_short_conv.)");

  m.def(
      "embedding_gather",
      &vllm_metal::embedding_gather,
      "ids"_a,
      "table"_a,
      "scales"_a = nb::none(),
      "biases"_a = nb::none(),
      "bits"_a = 0,
      "group_size"_a = 0,
      nb::kw_only(),
      "tiled"_a = false,
      "stream"_a = nb::none(),
      R"(Rows ids [...] of a dense table [V, D] (-> [..., D], table dtype) or of a
quantized one (uint32 [V, D * bits / 32] with scales/biases [V, D / group_size]
-> [..., D] in scales' dtype). Ids outside [0, V) raise at evaluation. tiled: a
quantized table in the int8 kernels' tile order (ops.linear.tile_quantized).)");

  m.def(
      "sample_tokens",
      &vllm_metal::sample_tokens,
      "logits"_a,
      "temperature"_a,
      "keys"_a,
      "min_p"_a = nb::none(),
      "top_k"_a = nb::none(),
      "top_p"_a = nb::none(),
      nb::kw_only(),
      "allowed"_a = nb::none(),
      "stream"_a = nb::none(),
      R"(One int32 token per row of logits [R, V]: temperature [R] > 0 draws from
softmax(logits / T), filtered by the optional per-row min_p, top_k, top_p (in
that order), by the inverse CDF at the uniform of keys uint32 [R, 2] (see
debug.key_uniform); temperature <= 0 takes the first index of the row's max.
allowed: optional uint32 [R, >= ceil(V / 32)], a grammar bitmask (bit c % 32 of
word c / 32 admits token c); the tokens it does not admit count as -inf logits.)");

  m.def(
      "top_logprobs",
      &vllm_metal::top_logprobs,
      "x"_a,
      "token"_a,
      "k"_a,
      "normalize"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Logprobs columns of x [R, V]: [ids int32 [R, k + 1], vals float32 [R, k + 1],
ranks int32 [R]]; column 0 is token [R], then the k largest scores (log_softmax(x)
when normalize, else x) in descending order; rank = number of scores >= the token's.)");

  m.def(
      "activation",
      &vllm_metal::activation,
      "x"_a,
      "kind"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(Elementwise activation of float32 x: kind 0 silu, 1 gelu_approx (tanh form),
2 gelu (erf), 3 gelu_fast_approx (x sigmoid(1.702 x)); fp32 arithmetic, same shape.)");

  m.def(
      "rms_norm",
      &vllm_metal::rms_norm,
      "x"_a,
      "weight"_a.none(),
      "eps"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(x [..., D] * rsqrt(mean(x^2) + eps) * weight [D] (weight may be None), fp32
arithmetic; returns x's shape in MLX's promotion of x's and weight's dtypes.)");

  m.def(
      "rope",
      &vllm_metal::rope,
      "x"_a,
      "dims"_a,
      nb::kw_only(),
      "traditional"_a,
      "base"_a.none(),
      "scale"_a,
      "offset"_a,
      "freqs"_a = nb::none(),
      "stream"_a = nb::none(),
      R"(Rotary embedding of x [B, ..., L, D] at positions offset [] or [B] + l, as
mx.fast.rope: the first dims features turn by position * scale * inv_freq,
inv_freq = base^(-2i/dims) or 1 / freqs. Returns x's shape and dtype.)");

  nb::class_<vllm_metal::DecoderStackWeights>(
      m, "DecoderStackWeights",
      R"(A model's decoder weights for decoder_stack, validated and
resolved once (the per-layer spec layout is in csrc/ops/decoder_stack.h).)")
      .def(nb::init<std::vector<mlx::core::array>, std::vector<int>, std::vector<float>,
                    mlx::core::array, float, int, int, int, int, bool, std::vector<int>,
                    std::vector<std::shared_ptr<vllm_metal::DecoderStackMoe>>, bool>(),
           "arrays"_a, "ints"_a, "floats"_a, "final_norm"_a, "final_eps"_a, "hidden"_a,
           "num_heads"_a, "num_kv_heads"_a, "head_dim"_a, "int8_activations"_a = false,
           "moe_layers"_a = std::vector<int>{},
           "moe"_a = std::vector<std::shared_ptr<vllm_metal::DecoderStackMoe>>{},
           "gathered"_a = false)
      .def_prop_ro("num_layers", &vllm_metal::DecoderStackWeights::num_layers)
      .def_prop_ro("gathered", &vllm_metal::DecoderStackWeights::gathered)
      .def_prop_ro("symmetric_linears", &vllm_metal::DecoderStackWeights::symmetric_linears,
                   "How many linears form each bias as -zero_point * scale (GGUF's Q4_0 "
                   "and Q8_0 with int8 activations) instead of reading it.");
  nb::class_<vllm_metal::DecoderStackMoe>(
      m, "DecoderStackMoe",
      R"(A mixture-of-experts MLP of one decoder-stack layer: router, experts
(float, MLX affine or MXFP4), top-k scoring, optional shared expert; the spec
layout is in csrc/ops/decoder_stack_moe.h.)")
      .def(nb::init<std::vector<mlx::core::array>, std::vector<int>, float, int, bool>(),
           "arrays"_a, "ints"_a, "scale"_a, "hidden"_a, "int8_activations"_a = false)
      .def_prop_ro("num_experts", &vllm_metal::DecoderStackMoe::num_experts);
  nb::class_<vllm_metal::DecoderStackLora>(
      m, "DecoderStackLora",
      R"(The resident LoRA adapters for decoder_stack, validated and resolved against
its weights once per change of adapters: table (layer, projection 0-6 for q k v
o gate up down, module, b_col0 per site, ordered by (layer, projection)); arrays
(a [L, r, in], b [L, r, out] float32, bfloat16 or float16, scale float32 [L] per
module); filled (L ints per module, nonzero where the slot's adapter targets it).)")
      .def(nb::init<std::shared_ptr<vllm_metal::DecoderStackWeights>, std::vector<int>,
                    std::vector<mlx::core::array>, std::vector<int>>(),
           "weights"_a, "table"_a, "arrays"_a, "filled"_a)
      .def_prop_ro("sites", [](const vllm_metal::DecoderStackLora& l) {
        std::vector<std::pair<int, int>> out;
        for (const auto& s : l.sites()) out.emplace_back(s.layer, s.projection);
        return out;
      }, "(layer, projection) of each site, in the order the stack visits them");
  m.def(
      "decoder_stack",
      &vllm_metal::decoder_stack,
      "weights"_a,
      "x"_a,
      "key_caches"_a,
      "value_caches"_a,
      "positions"_a,
      "slot_mappings"_a,
      "block_tables"_a,
      "seq_lens"_a,
      "cu_seqlens_q"_a,
      "layer_groups"_a,
      "lora"_a.none() = nb::none(),
      "lora_rows"_a = nb::none(),
      nb::kw_only(),
      "kv_quant"_a = 0,
      "key_columns"_a = false,
      "begin"_a = std::pair<int, int>{0, 0},
      "end"_a = std::pair<int, int>{-1, 0},
      "carry"_a = nb::none(),
      "rope_angles"_a = nb::none(),
      "key_ends"_a = nb::none(),
      "stream"_a = nb::none(),
      R"(Every decoder layer, then the final RMSNorm, as one CPU node. x float32
[1, T, hidden]; caches float32/float16/bfloat16 [num_blocks, block_size,
num_kv_heads, head_dim], row-contiguous, one key and one value per layer;
slot_mappings int32 [T] and block_tables int32 [S, max_blocks] per KV cache
group, layer_groups the group of each layer. lora (a DecoderStackLora of these
weights) and lora_rows (int [T], each row's adapter slot, -1 none): LoRA updates
added after the projections it names (none by default). key_columns: key
caches [num_blocks, num_kv_heads, head_dim, block_size] (paged_attention's).
Returns [hidden [1, T, hidden]]; the caches are written in place when the node
runs (read them only through work enqueued after it on the same stream).
begin, end: a segment, for tensor parallel with gathered output projections
(DecoderStackWeights(gathered=True)): from begin to end, each (layer, point),
point 0 a layer's start, 1 before o, 2 before down; end (-1, 0) through the final
norm. carry: begun at o or down, that projection's whole input float32
[1, T, in_features] (every rank's slice, gathered). Ended at o or down, returns
[residual stream [1, T, hidden], this rank's slice of that projection's input
[1, T, width]]. rope_angles: float32 [2, T, rope_dims / 2], cos then sin of each
row's rotary angles, in place of those formed from positions (M-RoPE). key_ends:
int32 [T], each row's key end in attention (paged_attention's), or None.)");

  m.def(
      "lora_delta",
      &vllm_metal::lora_delta,
      "x"_a,
      "idx"_a,
      "lora_a"_a,
      "lora_b"_a,
      "scale"_a,
      nb::kw_only(),
      "stream"_a = nb::none(),
      R"(The LoRA update of each row: x [..., in] (T rows), idx int [T] in [-1, L)
(-1: no adapter), lora_a [L, r, in] and lora_b [L, r, out] in x's dtype, scale
float [L]. Returns [..., out] in x's dtype: scale[a] * (A[a] @ x[t]) @ B[a] for
a = idx[t], zero where idx is -1 (fp32 accumulation, one rounding).)");

  m.def(
      "lora_apply",
      &vllm_metal::lora_apply,
      "y"_a,
      "x"_a,
      "idx"_a,
      "lora_a"_a,
      "lora_b"_a,
      "scale"_a,
      nb::kw_only(),
      "column_offset"_a = 0,
      "stream"_a = nb::none(),
      R"(y [..., out_cols] plus the LoRA update of lora_delta in columns
[column_offset, column_offset + out), rounded once; y's shape and dtype (x's).
y's buffer holds the result when nothing else holds y.)");

  m.def("data_ptr", &vllm_metal::data_ptr, "array"_a,
        "Address of an evaluated array's first element (huge-page advice; tests).");
  m.def("cpu_isa", &vllm_metal::cpu_isa,
        "Instruction set the CPU kernels use: 'avx512', 'avx2' or 'generic'.");
  m.def("cpu_amx", &vllm_metal::cpu_amx,
        "Whether int8-activation matmuls of debug.AMX_MIN_ROWS rows or more use AMX tiles "
        "(VLLM_METAL_CPU_AMX, the CPU, the active ISA).");
  m.def("cpu_threads", &vllm_metal::cpu_threads,
        "Threads of the CPU kernel pool (VLLM_METAL_CPU_THREADS; 0 = all).");
  m.def("scratch_bytes", &vllm_metal::cpu::scratch_bytes, "reset"_a = false,
        "(live, peak) bytes the CPU kernels hold of their own scratch (outside MLX's "
        "counters); reset=True first makes the peak the live figure.");
  vllm_metal::bind_dispatch(m);

  nb::module_ debug = m.def_submodule(
      "debug", "Test, benchmark and diagnostic hooks: not called by production.");
  debug.def("key_uniform", &vllm_metal::cpu::key_uniform, "high"_a, "low"_a,
            "The uniform in [0, 1) that sample_tokens draws for a row with key (high, low).");
  debug.attr("STACK_LAYER_INTS") = vllm_metal::kStackLayerInts;
  debug.attr("STACK_LAYER_FLOATS") = vllm_metal::kStackLayerFloats;
  debug.def("set_cpu_isa", &vllm_metal::set_cpu_isa, "name"_a,
            "Use a narrower instruction set than detected.");
  debug.attr("AMX_MIN_ROWS") = vllm_metal::cpu::kQ8AmxMinRows;
  debug.def("set_cpu_amx", &vllm_metal::set_cpu_amx, "on"_a,
            "Turn the int8 matmuls' AMX tiles off or back on (ValueError where there are none).");
  debug.def("pool_run", &vllm_metal::pool_run, "sleep_us"_a,
            "One pool job whose item i sleeps sleep_us[i] us: (runs per item, blocked joins).");
  debug.def("require_row_contiguous", &vllm_metal::require_row_contiguous, "op"_a, "inputs"_a, "names"_a,
            "eval_gpu's layout check of its inputs (raises ValueError naming the first strided one).");
  vllm_metal::bind_dispatch_debug(debug);
  vllm_metal::bind_lora_debug(debug);
  vllm_metal::bind_experts_debug(debug);
  vllm_metal::bind_mla_debug(debug);
  vllm_metal::bind_gdn_debug(debug);
}
