#include "ops/paged_attention.h"

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "cpu/attention/paged_attention_cpu.h"
#include "cpu/runtime/strided_copy.h"
#include "dispatch/diagnostics.h"
#include "dispatch/dispatch_env.h"
#include "dispatch/metal_launch_plan.h"
#include "dispatch/paged_metadata.h"
#include "metal/kernel_library.h"
#include "metal/metal_ops.h"
#include "ops/eval_layout.h"
#include "ops/kv_cache_shape.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "platform.h"

#if VLLM_METAL_APPLE()
#include "metal/launches.h"
#include "metal/nax_readiness.h"
#endif

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("paged_attention: " + msg);
}

bool is_float(mx::Dtype t) {
  return t == mx::float16 || t == mx::bfloat16 || t == mx::float32;
}

// Index metadata as contiguous int32 (a no-op when it already is).
mx::array as_index(const mx::array& a, const char* name, const mx::Stream& s) {
  if (!mx::issubdtype(a.dtype(), mx::integer)) {
    fail(std::string(name) + " must be an integer array");
  }
  return mx::contiguous(a.dtype() == mx::int32 ? a : mx::astype(a, mx::int32, s), false, s);
}

// A row-contiguous view of `cache` for the task: the cache itself, or a
// temporary the task fills first (returned layout) when it is strided.
std::optional<cpu::StridedLayout> readable_cache(
    const mx::array& cache,
    mx::array& view,
    mx::cpu::CommandEncoder& encoder) {
  auto layout = strided_layout(cache);
  if (!layout) {
    view = cache;
    return std::nullopt;
  }
  view = mx::array(cache.shape(), cache.dtype(), nullptr, {});
  view.set_data(mx::allocator::malloc(view.nbytes()));
  encoder.add_temporary(view);
  return layout;
}

dispatch::KernelDtype kernel_dtype(mx::Dtype t) {
  if (t == mx::float16) return dispatch::KernelDtype::Float16;
  if (t == mx::bfloat16) return dispatch::KernelDtype::BFloat16;
  if (t == mx::float32) return dispatch::KernelDtype::Float32;
  return dispatch::KernelDtype::Unsupported;
}

// The kernel shape of a call (vc: the value cache, whose rows give the block
// size and KV heads in every layout): a quantized cache (bytes) runs the
// query's element type with the kv_quant function constant.
dispatch::PagedProblem shape_problem(const mx::array& q, const mx::array& vc, KvQuant quant) {
  dispatch::PagedProblem p;
  p.num_heads = q.shape(1);
  p.num_kv_heads = vc.shape(2);
  p.head_size = q.shape(2);
  p.block_size = vc.shape(1);
  p.query_dtype = kernel_dtype(q.dtype());
  p.cache_dtype = quant == KvQuant::None ? kernel_dtype(vc.dtype()) : p.query_dtype;
  p.kv_quant = static_cast<int>(quant);
  return p;
}

// Values of an evaluated, contiguous 1-D int32/int64 array, else nullopt.
std::optional<std::vector<int32_t>> host_values(const mx::array& a) {
  if (!a.is_available() || a.ndim() != 1 || !a.flags().row_contiguous) return std::nullopt;
  std::vector<int32_t> v(a.size());
  if (a.dtype() == mx::int32) {
    std::copy(a.data<int32_t>(), a.data<int32_t>() + a.size(), v.begin());
  } else if (a.dtype() == mx::int64) {
    std::copy(a.data<int64_t>(), a.data<int64_t>() + a.size(), v.begin());
  } else {
    return std::nullopt;
  }
  return v;
}

// The Metal route's lengths, when the metadata is already evaluated. They are
// checked here as the CPU kernels check them in their task: a GPU kernel
// cannot raise, and this is the last point that can.
std::optional<HostLengths> host_lengths(const mx::array& seq_lens, const mx::array& cu_seqlens_q,
                                        int64_t total_q, int64_t capacity) {
  auto lens = host_values(seq_lens);
  auto cu = host_values(cu_seqlens_q);
  if (!lens || !cu || cu->size() != lens->size() + 1) return std::nullopt;
  dispatch::check_paged_metadata({cu->data(), lens->data(), static_cast<int>(lens->size()), total_q, capacity});
  HostLengths h;
  h.seq_lens = std::move(*lens);
  h.query_lens.resize(h.seq_lens.size());
  for (size_t s = 0; s < h.seq_lens.size(); ++s) h.query_lens[s] = (*cu)[s + 1] - (*cu)[s];
  return h;
}

// The GPU runs the op only with the Metal kernels loaded and a shape they
// cover (row-contiguous caches, one dtype); anything else runs on the CPU. A
// cache not yet evaluated passes the layout test here; eval_gpu tests it again.
// Key columns are the CPU backend's layout: the Metal kernels read rows.
bool runs_on_gpu(const mx::Stream& s, const mx::array& q, const mx::array& kc, const mx::array& vc,
                 KvQuant quant, bool key_columns) {
  if (s.device != mx::Device::gpu || !metal::kernels_configured() || key_columns) return false;
  if (!kc.flags().row_contiguous || !vc.flags().row_contiguous) return false;
  return dispatch::metal_supports(shape_problem(q, vc, quant));
}

} // namespace

mx::array paged_attention(
    const mx::array& query,
    const mx::array& key_cache,
    const mx::array& value_cache,
    const mx::array& block_tables,
    const mx::array& seq_lens,
    const mx::array& cu_seqlens_q,
    float scale,
    std::optional<int> sliding_window,
    std::optional<float> softcap,
    const std::optional<mx::array>& sinks,
    int kv_quant,
    bool key_columns,
    const std::optional<mx::array>& key_ends,
    mx::StreamOrDevice s) {
  if (kv_quant < 0 || kv_quant > kKvQuantLast) {
    fail("kv_quant must be a KvQuant (0-" + std::to_string(kKvQuantLast) + ")");
  }
  const auto quant = static_cast<KvQuant>(kv_quant);
  if (query.ndim() != 3) fail("query must be [total_q, num_heads, head_size]");
  if (!is_float(query.dtype())) fail("query must be float16, bfloat16 or float32");
  if (value_cache.ndim() != 4) {
    fail("value_cache must be [num_blocks, block_size, num_kv_heads, row width]");
  }
  const int num_heads = query.shape(1);
  const int num_kv_heads = value_cache.shape(2);
  const std::string problem =
      kv_cache_problem(key_cache, value_cache, quant, num_kv_heads, query.shape(2), key_columns);
  if (!problem.empty()) fail(problem);
  if (num_kv_heads == 0 || num_heads % num_kv_heads != 0) {
    fail("num_heads must be a multiple of num_kv_heads");
  }
  if (block_tables.ndim() != 2 || seq_lens.ndim() != 1 || cu_seqlens_q.ndim() != 1) {
    fail("block_tables must be 2-D, seq_lens and cu_seqlens_q 1-D");
  }
  const int num_seqs = block_tables.shape(0);
  if (seq_lens.shape(0) != num_seqs || cu_seqlens_q.shape(0) != num_seqs + 1) {
    fail("expected seq_lens [num_seqs] and cu_seqlens_q [num_seqs + 1]");
  }
  if (!std::isfinite(scale)) fail("scale must be finite");
  if (sliding_window && *sliding_window < 1) fail("sliding_window must be >= 1");
  if (softcap && !(*softcap > 0.0f && std::isfinite(*softcap))) fail("softcap must be > 0");

  auto stream = mx::to_stream(s);
  std::optional<HostLengths> lengths;
  if (stream.device == mx::Device::gpu) {
    if (runs_on_gpu(stream, query, key_cache, value_cache, quant, key_columns)) {
      lengths = host_lengths(seq_lens, cu_seqlens_q, query.shape(0),
                             static_cast<int64_t>(block_tables.shape(1)) * value_cache.shape(1));
    } else {
      stream = mx::default_stream(mx::Device::cpu);  // fallback: never fail on a shape
    }
  }
  // Caches go in as they are (contiguous() would copy views of larger
  // buffers on every call); eval_cpu copies only non-row-contiguous ones.
  std::vector<mx::array> inputs = {
      mx::contiguous(query, false, stream),
      key_cache,
      value_cache,
      as_index(block_tables, "block_tables", stream),
      as_index(seq_lens, "seq_lens", stream),
      as_index(cu_seqlens_q, "cu_seqlens_q", stream)};
  if (sinks) {
    if (sinks->ndim() != 1 || sinks->shape(0) != num_heads) fail("sinks must be [num_heads]");
    inputs.push_back(mx::contiguous(mx::astype(*sinks, mx::float32, stream), false, stream));
  }
  if (key_ends) {
    if (key_ends->ndim() != 1 || key_ends->shape(0) != query.shape(0)) fail("key_ends must be [total_q]");
    inputs.push_back(as_index(*key_ends, "key_ends", stream));
  }
  auto shape = query.shape();
  return mx::array(
      std::move(shape),
      query.dtype(),
      std::make_shared<PagedAttention>(
          stream, scale, sliding_window.value_or(0), softcap.value_or(0.0f), sinks.has_value(),
          quant, key_columns, key_ends.has_value(), std::move(lengths)),
      std::move(inputs));
}

void PagedAttention::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  out.set_data(mx::allocator::malloc(out.nbytes()));

  auto& encoder = mx::cpu::get_command_encoder(stream());
  const auto& q = inputs[0];
  mx::array kc = inputs[1];
  mx::array vc = inputs[2];
  auto key_layout = readable_cache(inputs[1], kc, encoder);
  auto value_layout = readable_cache(inputs[2], vc, encoder);
  // Strided caches: the task first copies src into the temporary (dst).
  const char* key_src = inputs[1].data<char>();
  const char* value_src = inputs[2].data<char>();
  char* key_dst = kc.data<char>();
  char* value_dst = vc.data<char>();

  cpu::PagedAttentionArgs args;
  args.query = q.data<void>();
  args.query_dtype = q.dtype();
  args.key_cache = kc.data<void>();
  args.value_cache = vc.data<void>();
  args.kv_dtype = kc.dtype();
  args.kv_quant = kv_quant_;
  args.key_columns = key_columns_;
  args.block_tables = inputs[3].data<int32_t>();
  args.seq_lens = inputs[4].data<int32_t>();
  args.cu_seqlens_q = inputs[5].data<int32_t>();
  args.sinks = has_sinks_ ? inputs[6].data<float>() : nullptr;
  args.out = out.data<void>();
  args.total_q = q.shape(0);
  args.num_heads = q.shape(1);
  args.head_size = q.shape(2);
  args.num_blocks = vc.shape(0);
  args.block_size = vc.shape(1);
  args.num_kv_heads = vc.shape(2);
  args.num_seqs = inputs[3].shape(0);
  args.max_blocks_per_seq = inputs[3].shape(1);
  args.scale = scale_;
  args.sliding_window = sliding_window_;
  args.softcap = softcap_;
  args.key_ends = has_key_ends_ ? inputs.back().data<int32_t>() : nullptr;

  for (const auto& in : inputs) encoder.set_input_array(in);
  encoder.set_output_array(out);
  // Metadata is read inside the task: only there are the inputs computed.
  encoder.dispatch(
      [args, key_layout, value_layout, key_src, value_src, key_dst, value_dst]() {
        if (key_layout) cpu::copy_to_row_contiguous(key_src, *key_layout, key_dst);
        if (value_layout) cpu::copy_to_row_contiguous(value_src, *value_layout, value_dst);
        dispatch::record_paged_dispatch(cpu::paged_attention_cpu(args));
      });
}

void PagedAttention::eval_gpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  // The caches go in as they are, and the op was routed here on flags read when
  // it was built: a cache not yet evaluated then shows up as row-contiguous.
  require_row_contiguous("paged_attention", inputs,
                         {"query", "key_cache", "value_cache", "block_tables", "seq_lens", "cu_seqlens_q",
                          has_sinks_ ? "sinks" : "key_ends", "key_ends"});
  const auto& q = inputs[0];
  dispatch::PagedProblem problem = shape_problem(q, inputs[2], kv_quant_);
  const int num_seqs = inputs[3].shape(0);
  if (host_lengths_) {
    problem.seq_lens = host_lengths_->seq_lens;
    problem.query_lens = host_lengths_->query_lens;
  } else {
    // Lengths unknown on the host: assume full block tables and one prefill-like
    // sequence holding every row, which selects Varlen or SplitKv (both correct
    // for any actual lengths: the kernels read them on the GPU).
    problem.seq_lens.assign(num_seqs, inputs[3].shape(1) * problem.block_size);
    problem.query_lens.assign(num_seqs, 0);
    if (num_seqs > 0) problem.query_lens[0] = q.shape(0);
  }
  dispatch::PagedAttentionFeatures features;
  features.scale = scale_;
  features.sliding_window = sliding_window_;
  features.softcap = softcap_;
  features.has_sinks = has_sinks_;
  features.has_key_ends = has_key_ends_;
  features.max_blocks_per_seq = inputs[3].shape(1);
  mx::metal::Device& device = mx::metal::device(stream().device);
  dispatch::DispatchEnv env{dispatch::gpu_core_count(), dispatch::gqa_decode_disabled()};
  // The tensor-op prefill tiles each sequence's rows: only with the real lengths.
  env.nax_available = host_lengths_.has_value() && metal::tensor_units_available();
  env.nax_disabled = dispatch::nax_prefill_disabled();
  dispatch::PagedDispatch decision = dispatch::decide_paged_dispatch(problem, env);
  if (decision.route == dispatch::PagedRoute::NaxPrefill &&
      !metal::tensor_launch_ready(device, dispatch::plan_paged_attention(problem, decision, features).launches[0])) {
    env.nax_available = false;  // the library or this pipeline failed (logged once): another route
    decision = dispatch::decide_paged_dispatch(problem, env);
  }
  dispatch::record_paged_dispatch(decision);
  metal::paged_attention_gpu(stream(), inputs, outputs[0], problem, decision, features);
#else
  (void)inputs;
  (void)outputs;
  throw std::runtime_error("PagedAttention has no GPU implementation on this platform; use the CPU stream.");
#endif
}

bool PagedAttention::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const PagedAttention&>(other);
  return kv_quant_ == o.kv_quant_ && key_columns_ == o.key_columns_ && scale_ == o.scale_ &&
      sliding_window_ == o.sliding_window_ && softcap_ == o.softcap_ && has_sinks_ == o.has_sinks_ &&
      has_key_ends_ == o.has_key_ends_;
}

std::vector<mx::Shape> PagedAttention::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[0].shape()};
}

} // namespace vllm_metal
