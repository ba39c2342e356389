#include "cpu/decoder_stack/moe_block.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/decoder_stack/stack_steps.h"
#include "cpu/runtime/scratch.h"

namespace vllm_metal::cpu {

namespace {

// Zeroes the choice scores of the n_group - topk_group groups whose two best
// scores sum lowest (ties: the later group goes).
void prune_groups(const StackMoe& m, std::vector<float>& chosen) {
  const int64_t per = static_cast<int64_t>(chosen.size()) / m.n_group;
  std::vector<float> group(m.n_group);
  for (int g = 0; g < m.n_group; ++g) {
    float best = -INFINITY, second = -INFINITY;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      const float v = chosen[e];
      if (v > best) {
        second = best;
        best = v;
      } else if (v > second) {
        second = v;
      }
    }
    group[g] = best + second;
  }
  std::vector<int> ranked(m.n_group);
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int a, int b) { return group[a] > group[b]; });
  for (int r = m.topk_group; r < m.n_group; ++r) {
    const int g = ranked[r];
    std::fill(chosen.begin() + g * per, chosen.begin() + (g + 1) * per, 0.0f);
  }
}

// The row's top_k experts (idx) and their weights (w) from its E logits.
void route_row(const StackMoe& m, const float* logits, int64_t experts, int32_t* idx, float* w,
               std::vector<int32_t>& order, std::vector<float>& p) {
  const int k = m.top_k;
  p.assign(logits, logits + experts);
  if (m.scoring == MoeScoring::Softmax) {
    const float top = *std::max_element(p.begin(), p.end());
    double sum = 0.0;
    for (auto& v : p) sum += (v = std::exp(v - top));
    for (auto& v : p) v = static_cast<float>(v / sum);
  }
  std::vector<float> chosen;  // what selects (Sigmoid: p + bias, groups pruned)
  const std::vector<float>* by = &p;
  if (m.scoring == MoeScoring::Sigmoid) {
    for (auto& v : p) v = 1.0f / (1.0f + std::exp(-v));
    chosen = p;
    if (m.correction_bias != nullptr) {
      for (int64_t e = 0; e < experts; ++e) chosen[e] += m.correction_bias[e];
    }
    if (m.n_group > 1) prune_groups(m, chosen);
    by = &chosen;
  }
  const std::vector<float>& sel = *by;
  order.resize(experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return sel[a] > sel[b] || (sel[a] == sel[b] && a < b);
  });
  for (int j = 0; j < k; ++j) {
    idx[j] = order[j];
    w[j] = p[order[j]];
  }
  if (m.scoring == MoeScoring::SoftmaxOfTopK) {
    const float top = w[0];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (w[j] = std::exp(w[j] - top));
    for (int j = 0; j < k; ++j) w[j] /= sum;
  } else if (m.normalize && (m.scoring != MoeScoring::Sigmoid || k > 1)) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += w[j];
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
  for (int j = 0; j < k; ++j) w[j] *= m.scale;
}

void experts(const StackExperts& e, const float* x, int64_t pairs_per_row, const int32_t* idx,
             int64_t pairs, float* out) {
  ExpertIO io{x, Elem::F32, pairs_per_row, idx, pairs, e.bias, e.bias_type, out, Elem::F32};
  io.int8_activations = e.int8_activations;
  expert_matmul_cpu(e.w, io);
}

int64_t rows_of(const ExpertStack& s) {
  return s.quantized ? s.q.n : s.d.n;
}

} // namespace

void moe_block(const StackMoe& m, StackActivation act, const float* x, int64_t t, int64_t hidden,
               float* out) {
  const int64_t num_experts = m.router.out_features();
  const int64_t k = m.top_k, pairs = t * k;
  const int64_t inter = rows_of(m.gate.w);
  ScratchVector<float> logits(t * num_experts);
  stack::linear(m.router, x, t, logits.data());
  ScratchVector<int32_t> idx(pairs);
  ScratchVector<float> weights(pairs);
  std::vector<int32_t> order;
  std::vector<float> p;
  for (int64_t r = 0; r < t; ++r) {
    route_row(m, logits.data() + r * num_experts, num_experts, idx.data() + r * k,
              weights.data() + r * k, order, p);
  }
  ScratchVector<float> gate(pairs * inter), up(pairs * inter), down(pairs * hidden);
  experts(m.gate, x, k, idx.data(), pairs, gate.data());
  experts(m.up, x, k, idx.data(), pairs, up.data());
  stack::gated(act, gate.data(), up.data(), pairs * inter);
  experts(m.down, gate.data(), 1, idx.data(), pairs, down.data());
  for (int64_t r = 0; r < t; ++r) {
    float* o = out + r * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float wj = weights[r * k + j];
      const float* d = down.data() + (r * k + j) * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] += wj * d[c];
    }
  }
  if (!m.has_shared) return;
  const int64_t shared_inter = m.shared_gate.out_features();
  ScratchVector<float> sg(t * shared_inter), su(t * shared_inter), sd(t * hidden);
  stack::linear(m.shared_gate, x, t, sg.data());
  stack::linear(m.shared_up, x, t, su.data());
  stack::gated(act, sg.data(), su.data(), t * shared_inter);
  stack::linear(m.shared_down, sg.data(), t, sd.data());
  ScratchVector<float> g(m.has_shared_gate ? t : 0);
  if (m.has_shared_gate) stack::linear(m.shared_gate_proj, x, t, g.data());
  for (int64_t r = 0; r < t; ++r) {
    const float s = m.has_shared_gate ? 1.0f / (1.0f + std::exp(-g[r])) : 1.0f;
    for (int64_t c = 0; c < hidden; ++c) out[r * hidden + c] += s * sd[r * hidden + c];
  }
}

} // namespace vllm_metal::cpu
