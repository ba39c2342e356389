#include "ops/decoder_stack_moe.h"

#include <string>

#include "ops/cpu_inputs.h"
#include "ops/stack_linears.h"

namespace vllm_metal {

namespace mx = mlx::core;

using stack_spec::fail;

namespace {

struct ExpertIndex {
  int w = -1, scales = -1, biases = -1, bias = -1;
};

constexpr int kLinear = stack_spec::kLinearInts;
enum Field {
  kTopK, kScoring, kNormalize, kHasShared, kHasSharedGate,
  kRouter = 5,
  kExperts = kRouter + kLinear,  // 4 ints per projection: bits, group_size, mxfp4, has_bias
  kShared = kExperts + 12,
  kSharedGateProj = kShared + 3 * kLinear,
  kHasCorrection = kSharedGateProj + kLinear, kGroups, kTopkGroup,
};
static_assert(kTopkGroup + 1 == kMoeInts);

// One expert projection's storage, as its 4 spec ints give it.
struct ExpertSpec {
  int bits, gs;
  bool mxfp4, bias;
};

void check_experts(const std::vector<mx::array>& arrays, const ExpertIndex& x, int bits, int gs,
                   bool mxfp4, int64_t experts, int64_t n, int64_t k, const std::string& where) {
  const mx::array& w = arrays[x.w];
  if (w.ndim() != 3 || w.shape(0) != experts || w.shape(1) != n) {
    fail(where + ": experts must be [" + std::to_string(experts) + ", " + std::to_string(n) +
         ", ...]");
  }
  if (bits == 0) {
    if (!is_linear_float(w.dtype()) || w.shape(2) != k) fail(where + ": float experts must be [E, n, k]");
  } else {
    if (w.dtype() != mx::uint32 || static_cast<int64_t>(w.shape(2)) * 32 != k * bits) {
      fail(where + ": quantized experts must be uint32 [E, n, k * bits / 32]");
    }
    const mx::Shape groups = {static_cast<int>(experts), static_cast<int>(n),
                              static_cast<int>(k / gs)};
    const mx::array& s = arrays[x.scales];
    if (s.shape() != groups || k % gs != 0) fail(where + ": scales must be [E, n, k / group_size]");
    if (mxfp4 ? s.dtype() != mx::uint8
              : !is_linear_float(s.dtype()) || arrays[x.biases].shape() != groups ||
                    arrays[x.biases].dtype() != s.dtype()) {
      fail(where + (mxfp4 ? ": mxfp4 scales must be uint8"
                          : ": scales and biases must be float, one dtype"));
    }
  }
  if (x.bias >= 0) {
    const mx::array& b = arrays[x.bias];
    if (b.ndim() != 2 || b.shape(0) != experts || b.shape(1) != n || !is_linear_float(b.dtype())) {
      fail(where + ": expert bias must be float [E, n]");
    }
  }
}

// With int8 activations affine experts take them too, their arrays tiled
// (stack_linears.h).
cpu::StackExperts experts_of(const std::vector<mx::array>& arrays, const ExpertIndex& x, int bits,
                             int gs, bool mxfp4, bool int8_activations) {
  cpu::StackExperts e;
  const mx::array& w = arrays[x.w];
  e.w.experts = w.shape(0);
  e.w.quantized = bits != 0;
  const int64_t n = w.shape(1);
  if (bits == 0) {
    e.w.d = {w.data<void>(), elem_of(w.dtype()), n, w.shape(2)};
  } else {
    const mx::array& s = arrays[x.scales];
    e.w.q = {w.data<uint32_t>(), s.data<void>(), mxfp4 ? nullptr : arrays[x.biases].data<void>(),
             mxfp4 ? cpu::Elem::F32 : elem_of(s.dtype()), bits, gs, n,
             static_cast<int64_t>(w.shape(2)) * 32 / bits};
    e.w.q.mxfp4 = mxfp4;
    e.int8_activations = e.w.q.tiled = int8_activations && !mxfp4;
  }
  if (x.bias >= 0) {
    e.bias = arrays[x.bias].data<void>();
    e.bias_type = elem_of(arrays[x.bias].dtype());
  }
  return e;
}

} // namespace

DecoderStackMoe::DecoderStackMoe(std::vector<mx::array> arrays, std::vector<int> ints, float scale,
                                 int hidden, bool int8_activations) {
  if (ints.size() != static_cast<size_t>(kMoeInts)) {
    fail("a MoE spec holds " + std::to_string(kMoeInts) + " ints");
  }
  const int* f = ints.data();
  const bool shared = f[kHasShared] != 0, shared_gate = f[kHasSharedGate] != 0;
  ExpertSpec spec[3];
  for (int j = 0; j < 3; ++j) {
    const int* g = f + kExperts + 4 * j;
    spec[j] = {g[0], g[1], g[2] != 0, g[3] != 0};
    const auto [bits, gs, mxfp4, bias] = spec[j];
    if (bits != 0 && bits != 4 && bits != 8) fail("MoE experts: bits must be 0, 4 or 8");
    if (mxfp4 ? bits != 4 || gs != 32 : bits != 0 && gs != 32 && gs != 64 && gs != 128) {
      fail("MoE experts: unsupported group size for their quantization");
    }
  }
  if (f[kScoring] < 0 || f[kScoring] > static_cast<int>(cpu::MoeScoring::Sigmoid)) {
    fail("MoE: unknown scoring " + std::to_string(f[kScoring]));
  }
  if (shared_gate && !shared) fail("MoE: a shared gate needs a shared expert");

  int next = 0;
  const stack_spec::LinearIndex router = stack_spec::take_linear(f + kRouter, next);
  ExpertIndex ex[3];
  for (int j = 0; j < 3; ++j) {
    ex[j].w = next++;
    if (spec[j].bits) {
      ex[j].scales = next++;
      if (!spec[j].mxfp4) ex[j].biases = next++;
    }
    if (spec[j].bias) ex[j].bias = next++;
  }
  stack_spec::LinearIndex sh[3];
  if (shared) {
    for (int j = 0; j < 3; ++j) sh[j] = stack_spec::take_linear(f + kShared + kLinear * j, next);
  }
  stack_spec::LinearIndex sg;
  if (shared_gate) sg = stack_spec::take_linear(f + kSharedGateProj, next);
  const int correction = f[kHasCorrection] != 0 ? next++ : -1;
  if (static_cast<size_t>(next) != arrays.size()) {
    fail("the MoE spec describes " + std::to_string(next) + " arrays, got " +
         std::to_string(arrays.size()));
  }

  const mx::array& rw = arrays[router.w];
  const int64_t experts = rw.ndim() == 2 ? rw.shape(0) : 0;
  if (experts < 1) fail("MoE router must be [E, hidden]");
  stack_spec::check_linear(arrays, router, experts, hidden, "MoE router");
  const int top_k = f[kTopK];
  if (top_k < 1 || top_k > experts) fail("MoE: top_k must be in [1, E]");
  const mx::array& gw = arrays[ex[0].w];
  if (gw.ndim() != 3) fail("MoE gate experts must be 3-D");
  const int64_t inter = gw.shape(1);
  const char* names[3] = {"MoE gate experts", "MoE up experts", "MoE down experts"};
  for (int j = 0; j < 3; ++j) {
    const bool down = j == 2;
    check_experts(arrays, ex[j], spec[j].bits, spec[j].gs, spec[j].mxfp4, experts,
                  down ? hidden : inter, down ? inter : hidden, names[j]);
  }
  if (shared) {
    const int64_t shared_inter = arrays[sh[0].w].ndim() == 2 ? arrays[sh[0].w].shape(0) : 0;
    stack_spec::check_linear(arrays, sh[0], shared_inter, hidden, "MoE shared gate_proj");
    stack_spec::check_linear(arrays, sh[1], shared_inter, hidden, "MoE shared up_proj");
    stack_spec::check_linear(arrays, sh[2], hidden, shared_inter, "MoE shared down_proj");
  }
  if (shared_gate) stack_spec::check_linear(arrays, sg, 1, hidden, "MoE shared expert gate");
  if (correction >= 0 && (arrays[correction].ndim() != 1 || arrays[correction].shape(0) != experts ||
                          arrays[correction].dtype() != mx::float32)) {
    fail("MoE correction bias must be float32 [E]");
  }
  const int n_group = f[kGroups], topk_group = f[kTopkGroup];
  if (n_group < 1 || experts % n_group != 0 || topk_group < 1 || topk_group > n_group ||
      (n_group > 1 && experts / n_group < 2) || topk_group * (experts / n_group) < top_k) {
    fail("MoE: n_group must divide E into groups of at least 2, topk_group in [1, n_group] "
         "holding at least top_k experts");
  }

  for (auto& a : arrays) a = materialized(a);
  arrays_ = std::move(arrays);
  num_experts_ = static_cast<int>(experts);
  view_.router = stack_spec::linear_of(arrays_, router, int8_activations);
  cpu::StackExperts* views[3] = {&view_.gate, &view_.up, &view_.down};
  for (int j = 0; j < 3; ++j) {
    *views[j] = experts_of(arrays_, ex[j], spec[j].bits, spec[j].gs, spec[j].mxfp4,
                           int8_activations);
  }
  view_.top_k = top_k;
  view_.scoring = static_cast<cpu::MoeScoring>(f[kScoring]);
  view_.normalize = f[kNormalize] != 0;
  view_.scale = scale;
  view_.has_shared = shared;
  if (shared) {
    view_.shared_gate = stack_spec::linear_of(arrays_, sh[0], int8_activations);
    view_.shared_up = stack_spec::linear_of(arrays_, sh[1], int8_activations);
    view_.shared_down = stack_spec::linear_of(arrays_, sh[2], int8_activations);
  }
  view_.correction_bias = correction >= 0 ? arrays_[correction].data<float>() : nullptr;
  view_.n_group = n_group;
  view_.topk_group = topk_group;
  view_.has_shared_gate = shared_gate;
  if (shared_gate) view_.shared_gate_proj = stack_spec::linear_of(arrays_, sg, int8_activations);
}

} // namespace vllm_metal
