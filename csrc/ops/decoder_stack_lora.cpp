#include "ops/decoder_stack_lora.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "ops/cpu_inputs.h"
#include "ops/decoder_stack.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("decoder_stack lora: " + msg);
}

const cpu::StackLinear& projection(const cpu::StackLayer& l, int p) {
  const cpu::StackLinear* all[kStackLinears] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
  return *all[p];
}

// One module's stacks against each other; returns (L, r).
std::pair<int, int> check_module(const mx::array& a, const mx::array& b, const mx::array& scale,
                                 const std::string& where) {
  if (a.dtype() != b.dtype() || !is_linear_float(a.dtype()) || scale.dtype() != mx::float32) {
    fail(where + ": a and b must be float32, bfloat16 or float16 (one dtype), scale float32");
  }
  if (a.ndim() != 3 || b.ndim() != 3 || b.shape(0) != a.shape(0) || b.shape(1) != a.shape(1) ||
      a.shape(0) < 1 || a.shape(1) < 1 || scale.ndim() != 1 || scale.shape(0) != a.shape(0)) {
    fail(where + ": a [L, r, in], b [L, r, out] and scale [L] disagree");
  }
  return {a.shape(0), a.shape(1)};
}

} // namespace

DecoderStackLora::DecoderStackLora(std::shared_ptr<DecoderStackWeights> weights,
                                   std::vector<int> table, std::vector<mx::array> arrays,
                                   std::vector<int> filled)
    : weights_(std::move(weights)) {
  if (!weights_) fail("weights must be given");
  if (arrays.empty() || arrays.size() % 3 != 0) fail("give three arrays (a, b, scale) per module");
  const int modules = static_cast<int>(arrays.size() / 3);
  if (table.size() % kStackLoraInts != 0) {
    fail("the table holds " + std::to_string(kStackLoraInts) +
         " ints per site (layer, projection, module, b_col0)");
  }
  for (int m = 0; m < modules; ++m) {
    const auto [slots, rank] = check_module(arrays[3 * m], arrays[3 * m + 1], arrays[3 * m + 2],
                                            "module " + std::to_string(m));
    (void)rank;
    if (m == 0) num_slots_ = slots;
    if (slots != num_slots_) fail("every module must have the same slots L");
  }
  if (filled.size() != static_cast<size_t>(modules) * num_slots_) {
    fail("filled must hold L = " + std::to_string(num_slots_) + " ints per module");
  }
  for (auto& a : arrays) a = materialized(a);
  arrays_ = std::move(arrays);
  filled_.reserve(filled.size());
  for (int f : filled) filled_.push_back(f != 0);

  int last = -1;
  for (size_t u = 0; u < table.size() / kStackLoraInts; ++u) {
    const int* e = table.data() + u * kStackLoraInts;
    const std::string where = "site " + std::to_string(u);
    if (e[0] < 0 || e[0] >= weights_->num_layers() || e[1] < 0 || e[1] >= kStackLinears) {
      fail(where + ": no layer " + std::to_string(e[0]) + " projection " + std::to_string(e[1]));
    }
    if (e[2] < 0 || e[2] >= modules) fail(where + ": no module " + std::to_string(e[2]));
    const int order = e[0] * kStackLinears + e[1];
    if (order <= last) fail(where + ": sites must be ordered by (layer, projection), one each");
    last = order;
    const cpu::StackLinear& lin = projection(weights_->layers()[e[0]], e[1]);
    const mx::array &a = arrays_[3 * e[2]], &b = arrays_[3 * e[2] + 1];
    if (a.shape(2) != lin.in_features()) {
      fail(where + ": a [L, r, in] = [.., .., " + std::to_string(a.shape(2)) +
           "] does not match the projection's " + std::to_string(lin.in_features()) + " inputs");
    }
    if (e[3] < 0 || e[3] + lin.out_features() > b.shape(2)) {
      fail(where + ": columns [" + std::to_string(e[3]) + ", " +
           std::to_string(e[3] + lin.out_features()) + ") are outside b's " +
           std::to_string(b.shape(2)));
    }
    cpu::StackLora l;
    l.layer = e[0];
    l.projection = e[1];
    l.a = a.data<void>();
    l.b = b.data<char>() + static_cast<int64_t>(e[3]) * b.itemsize();
    l.b_ld = b.shape(2);
    l.weight_type = elem_of(a.dtype());
    l.scale = arrays_[3 * e[2] + 2].data<float>();
    l.filled = filled_.data() + static_cast<size_t>(e[2]) * num_slots_;
    l.num_slots = num_slots_;
    l.rank = a.shape(1);
    l.in_features = a.shape(2);
    l.out_features = lin.out_features();
    sites_.push_back(l);
  }
}

} // namespace vllm_metal
