#include "ops/stack_linears.h"

#include <stdexcept>

#include "ops/cpu_inputs.h"

namespace vllm_metal::stack_spec {

namespace mx = mlx::core;

void fail(const std::string& msg) {
  throw std::invalid_argument("decoder_stack: " + msg);
}

LinearIndex take_linear(const int* spec, int& next) {
  LinearIndex x;
  x.bits = spec[0];
  x.group_size = spec[1];
  x.zero_point = spec[3];
  x.w = next++;
  if (x.bits) {
    x.scales = next++;
    if (!x.zero_point) x.biases = next++;
  }
  if (spec[2]) x.bias = next++;
  return x;
}

int64_t linear_in(const mx::array& w, int bits) {
  return bits ? static_cast<int64_t>(w.shape(1)) * 32 / bits : w.shape(1);
}

void check_linear(const std::vector<mx::array>& arrays, const LinearIndex& x, int64_t n,
                  int64_t k, const std::string& where) {
  const mx::array& w = arrays[x.w];
  if (w.ndim() != 2) fail(where + ": weight must be 2-D");
  if (x.bits) {
    if ((x.bits != 4 && x.bits != 8) || w.dtype() != mx::uint32) {
      fail(where + ": quantized weights must be uint32 with bits 4 or 8");
    }
    if (x.group_size != 32 && x.group_size != 64 && x.group_size != 128) {
      fail(where + ": group_size must be 32, 64 or 128");
    }
    if (x.zero_point && x.zero_point != 1 << (x.bits - 1)) {
      fail(where + ": a zero point must be 2^(bits - 1)");
    }
    const auto& s = arrays[x.scales];
    const mx::Shape groups = {static_cast<int>(n), static_cast<int>(k / x.group_size)};
    const bool biases_ok = x.zero_point || (arrays[x.biases].shape() == groups &&
                                            arrays[x.biases].dtype() == s.dtype());
    if (s.shape() != groups || !biases_ok || !is_linear_float(s.dtype()) ||
        k % x.group_size != 0) {
      fail(where + ": scales/biases must be float [N, K / group_size], one dtype");
    }
  } else if (x.zero_point) {
    fail(where + ": a dense linear has no zero point");
  } else if (!is_linear_float(w.dtype())) {
    fail(where + ": dense weights must be float");
  }
  if (w.shape(0) != n || linear_in(w, x.bits) != k) {
    fail(where + ": weight is " + std::to_string(w.shape(0)) + " x " +
         std::to_string(linear_in(w, x.bits)) + ", expected " + std::to_string(n) + " x " +
         std::to_string(k));
  }
  if (x.bias >= 0) {
    const auto& b = arrays[x.bias];
    if (b.ndim() != 1 || b.shape(0) != n || !is_linear_float(b.dtype())) {
      fail(where + ": bias must be float [" + std::to_string(n) + "]");
    }
  }
}


cpu::StackLinear linear_of(const std::vector<mx::array>& arrays, const LinearIndex& x,
                           bool int8_activations) {
  cpu::StackLinear l;
  if (x.w < 0) return l;  // absent (a mixture-of-experts layer's dense MLP)
  l.int8_activations = int8_activations && x.bits != 0;
  if (x.zero_point && !l.int8_activations) {
    fail("a symmetric linear (zero point, no biases) needs int8 activations");
  }
  const auto& w = arrays[x.w];
  if (x.bits) {
    const auto& s = arrays[x.scales];
    l.quant = cpu::QuantMatrix{w.data<uint32_t>(), s.data<void>(),
                               x.zero_point ? nullptr : arrays[x.biases].data<void>(),
                               elem_of(s.dtype()), x.bits, x.group_size, w.shape(0),
                               linear_in(w, x.bits)};
    l.quant.tiled = l.int8_activations;
    l.quant.zero_point = static_cast<float>(x.zero_point);
  } else {
    l.dense = cpu::DenseMatrix{w.data<void>(), elem_of(w.dtype()), w.shape(0), w.shape(1)};
  }
  if (x.bias >= 0) {
    l.bias = arrays[x.bias].data<void>();
    l.bias_type = elem_of(arrays[x.bias].dtype());
  }
  return l;
}

} // namespace vllm_metal::stack_spec
