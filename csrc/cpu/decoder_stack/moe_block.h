// The mixture-of-experts MLP of a decoder-stack layer (cpu/decoder_stack/):
// the router, top-k selection as the family scores it, the experts through
// the expert matmul (cpu/linear/experts_cpu.h), their weighted sum, and a
// shared expert if the layer has one.
#pragma once

#include <cstdint>

#include "cpu/decoder_stack/decoder_stack_cpu.h"
#include "cpu/linear/experts_cpu.h"

namespace vllm_metal::cpu {

// How a row's router logits become its experts and their weights:
//   Softmax        p = softmax(logits); the k largest p; weights p (then / sum if normalize)
//   SoftmaxOfTopK  the k largest logits; weights softmax over those k
//   Sigmoid        p = sigmoid(logits); experts chosen by p + correction_bias among
//                  the topk_group best of n_group groups (a group scored by its two
//                  best; the others' choices set to 0); weights p (then / sum if
//                  normalize and k > 1): DeepSeek-V3's "noaux_tc"
// then each weight times `scale`. Ties go to the lower expert index.
enum class MoeScoring : int { Softmax = 0, SoftmaxOfTopK = 1, Sigmoid = 2 };

// One expert projection: the stack [E, n, k] and an optional per-expert bias [E, n].
struct StackExperts {
  ExpertStack w{};
  const void* bias = nullptr;
  Elem bias_type = Elem::F32;
  bool int8_activations = false;  // affine experts only (ExpertIO::int8_activations)
};

struct StackMoe {
  StackLinear router;               // [E, hidden]
  StackExperts gate, up, down;      // [E, inter, hidden] x 2, [E, hidden, inter]
  int top_k = 1;
  MoeScoring scoring = MoeScoring::Softmax;
  bool normalize = false;
  float scale = 1.0f;
  const float* correction_bias = nullptr;  // Sigmoid: [E] or null
  int n_group = 1, topk_group = 1;          // Sigmoid
  // Shared expert: a dense gated MLP over every row, times sigmoid(shared_gate(x))
  // when has_shared_gate (Qwen2-MoE), added to the experts' sum.
  bool has_shared = false;
  StackLinear shared_gate, shared_up, shared_down;
  bool has_shared_gate = false;
  StackLinear shared_gate_proj;     // [1, hidden]
};

// out [t, hidden] = the layer's MLP of x [t, hidden] (act: the experts' and the
// shared expert's gated activation).
void moe_block(const StackMoe& m, StackActivation act, const float* x, int64_t t, int64_t hidden,
               float* out);

} // namespace vllm_metal::cpu
