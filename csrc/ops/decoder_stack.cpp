#include "ops/decoder_stack.h"

#include <utility>
#include <stdexcept>
#include <string>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "dispatch/diagnostics.h"
#include "mlx/allocator.h"
#include "mlx/transforms.h"
#include "mlx/backend/cpu/encoder.h"
#include "ops/cpu_inputs.h"
#include "ops/kv_cache_shape.h"
#include "ops/stack_linears.h"

namespace vllm_metal {

namespace mx = mlx::core;

using stack_spec::check_linear;
using stack_spec::fail;
using stack_spec::LinearIndex;
using stack_spec::kLinearInts;
using stack_spec::linear_of;

namespace {

LinearIndex take_linear_at(const int* spec, int& next) {
  if (spec[0] < 0) return LinearIndex{};
  return stack_spec::take_linear(spec, next);
}

// x, positions, seq_lens, cu_seqlens_q, then each group's slot mapping, then each
// group's block table; then, each when given: lora_rows, the carry, the rotary angles.
constexpr int kFixedInputs = 4;
const char* const kLinearNames[kStackLinears] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};

// Where each array of a layer sits in the flat `arrays` list.
struct LayerIndex {
  int input_norm = -1;
  LinearIndex lin[kStackLinears];
  int q_norm = -1, k_norm = -1;
  int post_attn_norm = -1;
  int post_norm = -1;
  int post_mlp_norm = -1;
  int freqs = -1;
  int sinks = -1;
};

// The tail of a layer's ints, after the linears': where it starts, and its fields.
constexpr int kTailAt = kLinearInts * kStackLinears;
enum Tail {
  kQkNorm, kRopeDims, kRopeTraditional, kRopeHasFreqs, kWindow, kNorms, kActivation, kHasSinks
};

std::vector<LayerIndex> index_layers(const std::vector<int>& ints, size_t num_arrays) {
  if (ints.empty() || ints.size() % kStackLayerInts != 0) {
    fail("ints must hold " + std::to_string(kStackLayerInts) + " entries per layer");
  }
  std::vector<LayerIndex> layers(ints.size() / kStackLayerInts);
  int next = 0;
  for (size_t li = 0; li < layers.size(); ++li) {
    const int* spec = ints.data() + li * kStackLayerInts;
    LayerIndex& L = layers[li];
    // A mixture-of-experts layer's gate, up and down have bits -1 and no arrays
    // (its DecoderStackMoe holds the MLP).
    auto take_linear = [&](int j) { L.lin[j] = take_linear_at(spec + kLinearInts * j, next); };
    const int* tail = spec + kTailAt;
    const int norms = tail[kNorms];
    if (norms & cpu::kPreAttention) L.input_norm = next++;
    for (int j = 0; j < 4; ++j) take_linear(j);
    if (tail[kQkNorm]) {
      L.q_norm = next++;
      L.k_norm = next++;
    }
    if (norms & cpu::kPostAttention) L.post_attn_norm = next++;
    if (norms & cpu::kPreMlp) L.post_norm = next++;
    for (int j = 4; j < kStackLinears; ++j) take_linear(j);
    if (norms & cpu::kPostMlp) L.post_mlp_norm = next++;
    if (tail[kRopeHasFreqs]) L.freqs = next++;
    if (tail[kHasSinks]) L.sinks = next++;
  }
  if (static_cast<size_t>(next) != num_arrays) {
    fail("the spec describes " + std::to_string(next) + " arrays, got " +
         std::to_string(num_arrays));
  }
  return layers;
}

void check_vector(const mx::array& a, int64_t n, const std::string& where) {
  if (a.ndim() != 1 || a.shape(0) != n || !is_linear_float(a.dtype())) {
    fail(where + " must be float [" + std::to_string(n) + "]");
  }
}

mx::array as_int32(const mx::array& a, const mx::Stream& s) {
  return a.dtype() == mx::int32 ? a : mx::astype(a, mx::int32, s);
}

cpu::StackNorm norm_of(const mx::array& w, float eps) {
  return cpu::StackNorm{w.data<void>(), elem_of(w.dtype()), eps};
}

} // namespace

DecoderStackWeights::DecoderStackWeights(
    std::vector<mx::array> arrays,
    std::vector<int> ints,
    std::vector<float> floats,
    mx::array final_norm,
    float final_eps,
    int hidden,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    bool int8_activations,
    std::vector<int> moe_layers,
    std::vector<std::shared_ptr<DecoderStackMoe>> moe,
    bool gathered)
    : moe_(std::move(moe)),
      final_norm_(std::move(final_norm)),
      hidden_(hidden),
      num_heads_(num_heads),
      num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      gathered_(gathered) {
  if (hidden <= 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      num_heads % num_kv_heads) {
    fail("hidden, num_heads, num_kv_heads, head_dim must be positive, num_heads a multiple "
         "of num_kv_heads");
  }
  const auto index = index_layers(ints, arrays.size());
  if (floats.size() != index.size() * kStackLayerFloats) {
    fail("floats must hold " + std::to_string(kStackLayerFloats) + " entries per layer");
  }
  const int64_t q_width = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv_width = static_cast<int64_t>(num_kv_heads) * head_dim;
  // Empty: no final norm (a pipeline stage before the last hands on its residual stream).
  if (final_norm_.size() != 0) check_vector(final_norm_, hidden, "final_norm");
  if (moe_layers.size() != moe_.size()) fail("moe_layers and moe must have one entry each");
  std::vector<const DecoderStackMoe*> moe_of(index.size(), nullptr);
  for (size_t i = 0; i < moe_.size(); ++i) {
    const int li = moe_layers[i];
    if (li < 0 || static_cast<size_t>(li) >= index.size() || moe_of[li] != nullptr || !moe_[i]) {
      fail("moe_layers must name distinct layers, each with its MoE");
    }
    moe_of[li] = moe_[i].get();
  }
  for (size_t li = 0; li < index.size(); ++li) {
    const LayerIndex& L = index[li];
    const std::string where = "layer " + std::to_string(li);
    const bool dense_mlp = L.lin[4].w >= 0 && L.lin[5].w >= 0 && L.lin[6].w >= 0;
    if (dense_mlp == (moe_of[li] != nullptr)) {
      fail(where + ": needs either gate/up/down linears or a MoE (bits -1 and moe_layers)");
    }
    if (L.lin[0].w < 0 || L.lin[1].w < 0 || L.lin[2].w < 0 || L.lin[3].w < 0) {
      fail(where + ": q/k/v/o need bits >= 0");
    }
    if (gathered && !dense_mlp) fail(where + ": gathered output projections need a dense MLP");
    const int64_t inter = dense_mlp ? arrays[L.lin[4].w].shape(0) : 0;
    // Gathered, o and down are whole: their inputs are every rank's heads / columns.
    const auto whole = [&](int j, int64_t local) {
      return gathered ? stack_spec::linear_in(arrays[L.lin[j].w], L.lin[j].bits) : local;
    };
    const int64_t dims[kStackLinears][2] = {{q_width, hidden}, {kv_width, hidden},
                                            {kv_width, hidden}, {hidden, whole(3, q_width)},
                                            {inter, hidden}, {inter, hidden},
                                            {hidden, dense_mlp ? whole(6, inter) : 0}};
    for (int j = 0; j < (dense_mlp ? kStackLinears : 4); ++j) {
      check_linear(arrays, L.lin[j], dims[j][0], dims[j][1], where + " " + kLinearNames[j]);
    }
    const int* tail = ints.data() + li * kStackLayerInts + kTailAt;
    const std::pair<int, const char*> norms[] = {
        {L.input_norm, " input_norm"}, {L.post_attn_norm, " post_attn_norm"},
        {L.post_norm, " post_norm"}, {L.post_mlp_norm, " post_mlp_norm"}};
    for (const auto& [at, name] : norms) {
      if (at >= 0) check_vector(arrays[at], hidden, where + name);
    }
    if (tail[kNorms] < 0 || tail[kNorms] > 15) fail(where + ": norms must be a 4-bit mask");
    if (tail[kActivation] < static_cast<int>(cpu::StackActivation::Silu) ||
        tail[kActivation] > static_cast<int>(cpu::StackActivation::SwigluOai)) {
      fail(where + ": unknown activation " + std::to_string(tail[kActivation]));
    }
    if (tail[kQkNorm] < 0 || tail[kQkNorm] > 2) fail(where + ": qk_norm must be 0, 1 or 2");
    if (L.q_norm >= 0) {
      const bool across = tail[kQkNorm] == static_cast<int>(cpu::StackQkNorm::AcrossHeads);
      check_vector(arrays[L.q_norm], across ? q_width : head_dim, where + " q_norm");
      check_vector(arrays[L.k_norm], across ? kv_width : head_dim, where + " k_norm");
    }
    const int rope_dims = tail[kRopeDims];
    if (rope_dims < 0 || rope_dims % 2 || rope_dims > head_dim) {
      fail(where + ": rope dims must be even and in [0, head_dim]");
    }
    if (L.freqs >= 0) {
      check_vector(arrays[L.freqs], rope_dims / 2, where + " rope freqs");
      if (arrays[L.freqs].dtype() != mx::float32) fail(where + ": rope freqs must be float32");
    }
    if (L.sinks >= 0) {
      check_vector(arrays[L.sinks], num_heads, where + " sinks");
      if (arrays[L.sinks].dtype() != mx::float32) fail(where + ": sinks must be float32");
    }
  }

  for (auto& a : arrays) a = materialized(a);
  arrays_ = std::move(arrays);
  if (final_norm_.size() != 0) {
    final_norm_ = materialized(final_norm_);
    final_norm_view_ = norm_of(final_norm_, final_eps);
  }
  for (size_t li = 0; li < index.size(); ++li) {
    const LayerIndex& L = index[li];
    const int* tail = ints.data() + li * kStackLayerInts + kTailAt;
    const float* f = floats.data() + li * kStackLayerFloats;
    cpu::StackLayer l;
    l.norms = tail[kNorms];
    if (L.input_norm >= 0) l.input_norm = norm_of(arrays_[L.input_norm], f[0]);
    l.q = linear_of(arrays_, L.lin[0], int8_activations);
    l.k = linear_of(arrays_, L.lin[1], int8_activations);
    l.v = linear_of(arrays_, L.lin[2], int8_activations);
    l.o = linear_of(arrays_, L.lin[3], int8_activations);
    l.qk_norm = static_cast<cpu::StackQkNorm>(tail[kQkNorm]);
    if (L.q_norm >= 0) {
      l.q_norm = norm_of(arrays_[L.q_norm], f[2]);
      l.k_norm = norm_of(arrays_[L.k_norm], f[2]);
    }
    if (L.post_attn_norm >= 0) l.post_attn_norm = norm_of(arrays_[L.post_attn_norm], f[7]);
    if (L.post_norm >= 0) l.post_norm = norm_of(arrays_[L.post_norm], f[1]);
    l.gate = linear_of(arrays_, L.lin[4], int8_activations);
    l.up = linear_of(arrays_, L.lin[5], int8_activations);
    l.down = linear_of(arrays_, L.lin[6], int8_activations);
    if (moe_of[li] != nullptr) l.moe = &moe_of[li]->view();
    if (L.post_mlp_norm >= 0) l.post_mlp_norm = norm_of(arrays_[L.post_mlp_norm], f[8]);
    l.activation = static_cast<cpu::StackActivation>(tail[kActivation]);
    l.residual_scale = f[9];
    l.rope_dims = tail[kRopeDims];
    l.rope_traditional = tail[kRopeTraditional] != 0;
    l.rope_freqs = L.freqs >= 0 ? arrays_[L.freqs].data<float>() : nullptr;
    l.rope_base = f[3];
    l.rope_scale = f[4];
    l.attn_scale = f[5];
    l.softcap = f[6];
    l.sliding_window = tail[kWindow];
    l.sinks = L.sinks >= 0 ? arrays_[L.sinks].data<float>() : nullptr;
    layers_.push_back(l);
  }
}

int DecoderStackWeights::symmetric_linears() const {
  int count = 0;
  for (const auto& l : layers_) {
    for (const cpu::StackLinear* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      count += x->quant.bits != 0 && x->quant.biases == nullptr && !x->quant.mxfp4;
    }
  }
  return count;
}

namespace {

// The width of the input of the projection at `p` (o or down) of layer p.layer:
// whole (gathered) or this rank's slice.
int64_t projection_input(const DecoderStackWeights& w, cpu::StackPoint p, bool whole) {
  const cpu::StackLayer& l = w.layers()[p.layer];
  if (p.at == cpu::kBeforeO) {
    return whole ? l.o.in_features() : int64_t(w.num_heads()) * w.head_dim();
  }
  return whole ? l.down.in_features() : l.gate.out_features();
}

void check_segment(const DecoderStackWeights& w, cpu::StackPoint begin, cpu::StackPoint end,
                   const std::optional<mx::array>& carry, int t, bool lora) {
  const int layers = w.num_layers();
  const bool whole = begin.layer == 0 && begin.at == cpu::kLayerStart && end.layer == -1;
  if (whole && !carry) return;
  if (!w.gathered()) fail("a segment needs weights built with gathered output projections");
  if (lora) fail("a segment takes no LoRA adapters");
  auto point_ok = [&](cpu::StackPoint p) {
    return p.layer >= 0 && p.layer < layers && p.at >= cpu::kLayerStart &&
        p.at <= cpu::kBeforeDown;
  };
  if (!point_ok(begin) || (end.layer != -1 && (!point_ok(end) || end.at == cpu::kLayerStart)) ||
      (end.layer == -1 && end.at != cpu::kLayerStart)) {
    fail("begin must be (layer, 0-2) and end (layer, 1-2) or (-1, 0), layer in [0, " +
         std::to_string(layers) + ")");
  }
  if (end.layer != -1 && std::pair(end.layer, end.at) <= std::pair(begin.layer, begin.at)) {
    fail("end must come after begin");
  }
  for (const auto p : {begin, end}) {
    if (p.layer >= 0 && p.at == cpu::kBeforeDown && w.layers()[p.layer].moe != nullptr) {
      fail("layer " + std::to_string(p.layer) + " has no down projection (a MoE)");
    }
  }
  if (carry.has_value() != (begin.at != cpu::kLayerStart)) {
    fail("give carry exactly when beginning at o or down");
  }
  if (carry) {
    const int64_t width = projection_input(w, begin, true);
    if (carry->dtype() != mx::float32 || carry->ndim() != 3 || carry->shape(0) != 1 ||
        carry->shape(1) != t || carry->shape(2) != width) {
      fail("carry must be float32 [1, T, " + std::to_string(width) + "]");
    }
  }
}

} // namespace

std::vector<mx::array> decoder_stack(
    std::shared_ptr<DecoderStackWeights> weights,
    const mx::array& x,
    const std::vector<mx::array>& key_caches,
    const std::vector<mx::array>& value_caches,
    const mx::array& positions,
    const std::vector<mx::array>& slot_mappings,
    const std::vector<mx::array>& block_tables,
    const mx::array& seq_lens,
    const mx::array& cu_seqlens_q,
    const std::vector<int>& layer_groups,
    std::shared_ptr<DecoderStackLora> lora,
    const std::optional<mx::array>& lora_rows,
    int kv_quant,
    bool key_columns,
    std::pair<int, int> begin_at,
    std::pair<int, int> end_at,
    const std::optional<mx::array>& carry,
    const std::optional<mx::array>& rope_angles,
    const std::optional<mx::array>& key_ends,
    mx::StreamOrDevice s) {
  const cpu::StackPoint begin{begin_at.first, begin_at.second};
  const cpu::StackPoint end{end_at.first, end_at.second};
  if (!weights) fail("weights must be given");
  if (kv_quant < 0 || kv_quant > kKvQuantLast) {
    fail("kv_quant must be a KvQuant (0-" + std::to_string(kKvQuantLast) + ")");
  }
  const auto quant = static_cast<KvQuant>(kv_quant);
  if (x.dtype() != mx::float32 || x.ndim() != 3 || x.shape(0) != 1 ||
      x.shape(2) != weights->hidden()) {
    fail("x must be float32 [1, T, hidden = " + std::to_string(weights->hidden()) + "]");
  }
  const int layers = weights->num_layers();
  if (static_cast<int>(key_caches.size()) != layers ||
      static_cast<int>(value_caches.size()) != layers) {
    fail("give one key and one value cache per layer (" + std::to_string(layers) + ")");
  }
  for (int l = 0; l < layers; ++l) {
    const std::string problem =
        kv_cache_problem(key_caches[l], value_caches[l], quant, weights->num_kv_heads(), weights->head_dim(),
                         key_columns);
    if (!problem.empty()) fail("layer " + std::to_string(l) + ": " + problem);
    if (key_caches[l].shape() != key_caches[0].shape() || value_caches[l].shape() != value_caches[0].shape() ||
        key_caches[l].dtype() != key_caches[0].dtype()) {
      fail("every layer's caches must have layer 0's shapes and dtype");
    }
  }
  const int t = x.shape(1);
  const int groups = static_cast<int>(slot_mappings.size());
  if (groups == 0 || static_cast<int>(block_tables.size()) != groups) {
    fail("give one slot mapping and one block table per KV cache group");
  }
  if (static_cast<int>(layer_groups.size()) != layers) {
    fail("give one group per layer (" + std::to_string(layers) + ")");
  }
  for (int g : layer_groups) {
    if (g < 0 || g >= groups) fail("a layer's group is not one of the " +
                                   std::to_string(groups) + " given");
  }
  std::vector<const mx::array*> per_token = {&positions};
  for (const auto& m : slot_mappings) per_token.push_back(&m);
  for (const auto* m : per_token) {
    if (m->ndim() != 1 || m->shape(0) != t || !mx::issubdtype(m->dtype(), mx::integer)) {
      fail("positions and slot mappings must be integer [T]");
    }
  }
  if (seq_lens.ndim() != 1 || cu_seqlens_q.ndim() != 1 ||
      cu_seqlens_q.shape(0) != seq_lens.shape(0) + 1) {
    fail("seq_lens [S] and cu_seqlens_q [S + 1] disagree");
  }
  for (const auto& table : block_tables) {
    if (table.ndim() != 2 || table.shape(0) != seq_lens.shape(0)) {
      fail("block tables must be [S, max_blocks] with S = len(seq_lens)");
    }
  }
  if ((lora != nullptr) != lora_rows.has_value()) fail("give lora and lora_rows together");
  if (lora) {
    if (!lora->resolved_for(*weights)) fail("lora was resolved against other weights");
    if (lora_rows->ndim() != 1 || lora_rows->shape(0) != t ||
        !mx::issubdtype(lora_rows->dtype(), mx::integer)) {
      fail("lora_rows must be integer [T]");
    }
  }
  // The caches ride in the primitive (see decoder_stack.h), so they must have
  // their buffers before the node is built: evaluate any that are still lazy.
  std::vector<mx::array> caches(key_caches);
  caches.insert(caches.end(), value_caches.begin(), value_caches.end());
  std::vector<mx::array> lazy;
  for (const auto& c : caches) {
    if (c.status() == mx::array::Status::unscheduled) lazy.push_back(c);
  }
  if (!lazy.empty()) mx::eval(lazy);
  for (const auto& c : caches) {
    if (!c.flags().row_contiguous) {
      fail("the caches must be row-contiguous (they are written in place)");
    }
  }
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs = {x, as_int32(positions, stream), as_int32(seq_lens, stream),
                                   as_int32(cu_seqlens_q, stream)};
  for (const auto& m : slot_mappings) inputs.push_back(as_int32(m, stream));
  for (const auto& table : block_tables) inputs.push_back(as_int32(table, stream));
  if (lora) inputs.push_back(as_int32(*lora_rows, stream));
  check_segment(*weights, begin, end, carry, t, lora != nullptr);
  if (carry) inputs.push_back(*carry);
  if (rope_angles) {
    int half = 0;
    for (const auto& l : weights->layers()) {
      if (l.rope_dims == 0) continue;
      if (half != 0 && l.rope_dims / 2 != half) {
        fail("rope_angles: the layers rotate different widths");
      }
      half = l.rope_dims / 2;
    }
    if (half == 0) fail("rope_angles given to layers without rotary embeddings");
    if (rope_angles->dtype() != mx::float32 || rope_angles->ndim() != 3 ||
        rope_angles->shape(0) != 2 || rope_angles->shape(1) != t ||
        rope_angles->shape(2) != half) {
      fail("rope_angles must be float32 [2, T, " + std::to_string(half) + "] (cos, sin)");
    }
    inputs.push_back(*rope_angles);
  }
  if (key_ends) {
    if (key_ends->ndim() != 1 || key_ends->shape(0) != t || !mx::issubdtype(key_ends->dtype(), mx::integer)) {
      fail("key_ends must be integer [T]");
    }
    inputs.push_back(as_int32(*key_ends, stream));
  }
  std::vector<mx::Shape> shapes = {x.shape()};
  if (end.layer != -1) {
    shapes.push_back({1, t, static_cast<int>(projection_input(*weights, end, false))});
  }
  std::vector<mx::Dtype> dtypes(shapes.size(), mx::float32);
  return mx::array::make_arrays(
      std::move(shapes), dtypes,
      std::make_shared<DecoderStack>(stream, std::move(weights), std::move(caches), layer_groups,
                                     std::move(lora), quant, key_columns, begin, end,
                                     rope_angles.has_value(), key_ends.has_value()),
      std::move(inputs));
}

void DecoderStack::eval_cpu(const std::vector<mx::array>& inputs,
                            std::vector<mx::array>& outputs) {
  auto& encoder = mx::cpu::get_command_encoder(stream());
  const int layers = weights_->num_layers();
  for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
  auto& out = outputs[0];

  std::vector<RowContiguous> in;
  for (const auto& i : inputs) in.push_back(row_contiguous(i, encoder));
  const bool carry = begin_.at != cpu::kLayerStart;
  const int groups = (static_cast<int>(inputs.size()) - kFixedInputs - (lora_ ? 1 : 0) -
                      (carry ? 1 : 0) - (rope_angles_ ? 1 : 0) - (key_ends_ ? 1 : 0)) / 2;
  int optional = kFixedInputs + 2 * groups;   // the next optional input

  cpu::StackArgs a;
  const auto& x = in[0].view;
  a.x = x.data<float>();
  a.out = out.data<float>();
  a.t = x.shape(1);
  a.hidden = x.shape(2);
  a.num_heads = weights_->num_heads();
  a.num_kv_heads = weights_->num_kv_heads();
  a.head_dim = weights_->head_dim();
  const std::vector<mx::array>& caches = *caches_;
  const mx::array& cache0 = caches[0];
  const mx::array& value0 = caches[layers];  // rows in every layout: block size
  a.num_blocks = value0.shape(0);
  a.block_size = value0.shape(1);
  a.kv_quant = kv_quant_;
  a.key_columns = key_columns_;
  if (kv_quant_ == KvQuant::None) a.kv_type = elem_of(cache0.dtype());
  a.positions = in[1].view.data<int32_t>();
  a.seq_lens = in[2].view.data<int32_t>();
  a.cu_seqlens_q = in[3].view.data<int32_t>();
  a.num_seqs = in[2].view.shape(0);
  for (int g = 0; g < groups; ++g) {
    a.slot_mappings.push_back(in[kFixedInputs + g].view.data<int32_t>());
    const auto& table = in[kFixedInputs + groups + g].view;
    a.block_tables.push_back(table.data<int32_t>());
    a.max_blocks_per_seq.push_back(table.shape(1));
  }
  a.layer_groups = layer_groups_;
  a.final_norm = weights_->final_norm();
  a.layers = &weights_->layers();
  for (int li = 0; li < layers; ++li) {
    a.key_caches.push_back(const_cast<void*>(caches[li].data<void>()));
    a.value_caches.push_back(const_cast<void*>(caches[layers + li].data<void>()));
  }
  if (lora_) {
    a.lora = &lora_->sites();
    a.lora_rows = in[optional++].view.data<int32_t>();
  }
  a.begin = begin_;
  a.end = end_;
  if (carry) a.carry_in = in[optional++].view.data<float>();
  if (rope_angles_) {
    const auto& angles = in[optional++].view;
    a.rope_cos = angles.data<float>();
    a.rope_sin = a.rope_cos + angles.size() / 2;
  }
  if (key_ends_) a.key_ends = in[optional++].view.data<int32_t>();
  if (outputs.size() > 1) a.carry_out = outputs[1].data<float>();

  for (const auto& i : inputs) encoder.set_input_array(i);
  for (auto& o : outputs) encoder.set_output_array(o);
  // The task holds the weights and the caches: a step in flight keeps them alive.
  encoder.dispatch([in = std::move(in), a = std::move(a), keep = weights_, held = caches_,
                    adapters = lora_]() {
    for (const auto& r : in) r.fill();
    dispatch::record_paged_dispatch(cpu::decoder_stack_cpu(a));
  });
}

bool DecoderStack::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const DecoderStack&>(other);
  if (weights_ != o.weights_ || caches_->size() != o.caches_->size() ||
      layer_groups_ != o.layer_groups_ || lora_ != o.lora_ || kv_quant_ != o.kv_quant_ ||
      key_columns_ != o.key_columns_ || rope_angles_ != o.rope_angles_ || key_ends_ != o.key_ends_ ||
      begin_.layer != o.begin_.layer ||
      begin_.at != o.begin_.at || end_.layer != o.end_.layer || end_.at != o.end_.at) {
    return false;
  }
  for (size_t i = 0; i < caches_->size(); ++i) {
    if ((*caches_)[i].id() != (*o.caches_)[i].id()) return false;
  }
  return true;
}

std::vector<mx::Shape> DecoderStack::output_shapes(const std::vector<mx::array>& inputs) {
  std::vector<mx::Shape> shapes = {inputs[0].shape()};
  if (end_.layer != -1) {
    shapes.push_back({1, inputs[0].shape(1),
                      static_cast<int>(projection_input(*weights_, end_, false))});
  }
  return shapes;
}

} // namespace vllm_metal
