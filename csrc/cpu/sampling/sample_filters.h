// Cut-offs of top-k and top-p over a row's sampling weights, without a sort.
//
// The weights are w_i = exp((x_i - max) / T) in [0, 1] (0 for dropped tokens).
// Positive floats order like their bit patterns, so both cut-offs are found
// by radix selection on the bits: a histogram per level (exponent, then two
// slices of the mantissa) narrows the candidates to the one bucket that holds
// the answer. Three passes at most, each over fewer values than the last;
// MLX's CPU backend instead sorts the 1024 largest logits (or, when top-p
// needs more, the whole vocab).
#pragma once

#include <cstdint>
#include <vector>

namespace vllm_metal::cpu {

struct SelectScratch {
  std::vector<float> candidates;
};

// The k-th largest of the weights >= floor (and > 0); floor itself when
// fewer than k weights qualify (k >= 1).
float kth_largest_weight(const float* w, int64_t n, float floor, int64_t k,
                         SelectScratch& scratch);

// top-p's cut-off over the weights >= floor (and > 0), whose sum is `mass`:
// the smallest kept value v such that the weights <= v sum to more than
// mass * (1 - top_p). Keeping every weight >= v keeps the smallest set of
// largest tokens that holds top_p of the mass (ties at v all kept), and the
// largest token always. 0 < top_p < 1.
float top_p_cutoff(const float* w, int64_t n, float floor, double mass, float top_p,
                   SelectScratch& scratch);

} // namespace vllm_metal::cpu
