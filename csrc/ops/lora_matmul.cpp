#include "ops/lora_matmul.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cpu/lora/lora_cpu.h"
#include "metal/kernel_library.h"
#include "metal/lora_metal.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "ops/cpu_inputs.h"
#include "ops/eval_layout.h"
#include "platform.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("lora: " + msg);
}

std::string str(const mx::Shape& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

std::string str(mx::Dtype t) {
  std::ostringstream s;
  s << t;
  return s.str();
}

std::string idx_error(int64_t t, int64_t value, int num_slots) {
  const std::string l = std::to_string(num_slots);
  return "lora: idx[" + std::to_string(t) + "] = " + std::to_string(value) + " is outside [-1, " + l + "): " + l +
      " adapter slots, -1 = no adapter";
}

// The GPU's check of idx: a kernel cannot raise, so the host checks idx now,
// when it is already evaluated (the runner builds it with numpy); lazy idx is
// not waited for, and a row outside [-1, L) then gets no update.
void check_evaluated_idx(const mx::array& idx, int num_slots) {
  if (!idx.is_available() || !idx.flags().row_contiguous) return;
  for (size_t t = 0; t < idx.size(); ++t) {
    int64_t v;
    if (idx.dtype() == mx::int32) {
      v = idx.data<int32_t>()[t];
    } else if (idx.dtype() == mx::int64) {
      v = idx.data<int64_t>()[t];
    } else {
      return;
    }
    if (v < -1 || v >= num_slots) throw std::out_of_range(idx_error(static_cast<int64_t>(t), v, num_slots));
  }
}

mx::array build(const std::optional<mx::array>& y, const mx::array& x, const mx::array& idx,
                const mx::array& lora_a, const mx::array& lora_b, const mx::array& scale, int column_offset,
                mx::StreamOrDevice s) {
  if (x.ndim() < 1 || !is_linear_float(x.dtype())) {
    fail("x must be float16, bfloat16 or float32 [..., in], got " + str(x.dtype()) + " " + str(x.shape()));
  }
  const int64_t rows = leading_rows(x);
  const int in = x.shape(-1);
  if (!mx::issubdtype(idx.dtype(), mx::integer)) fail("idx must be an integer array, got " + str(idx.dtype()));
  if (idx.ndim() != 1 || idx.shape(0) != rows) {
    fail("idx must be [T] = [" + std::to_string(rows) + "] (x's rows), got " + str(idx.shape()));
  }
  if (lora_a.ndim() != 3) fail("lora_a must be 3-D [L, r, in], got " + str(lora_a.shape()));
  if (lora_b.ndim() != 3) fail("lora_b must be 3-D [L, r, out], got " + str(lora_b.shape()));
  const int num_slots = lora_a.shape(0), rank = lora_a.shape(1), out = lora_b.shape(2);
  if (lora_a.shape(2) != in) {
    fail("lora_a [L, r, in] = " + str(lora_a.shape()) + " does not match x's in = " + std::to_string(in));
  }
  if (lora_b.shape(0) != num_slots || lora_b.shape(1) != rank) {
    fail("lora_b [L, r, out] = " + str(lora_b.shape()) + " does not match lora_a's L = " +
         std::to_string(num_slots) + " and r = " + std::to_string(rank));
  }
  if (num_slots < 1 || rank < 1) fail("lora_a needs at least one slot (L >= 1) of rank r >= 1");
  auto stream = mx::to_stream(s);
  const bool gpu = stream.device == mx::Device::gpu && metal::kernels_configured();
  if (stream.device == mx::Device::gpu && !gpu) stream = mx::default_stream(mx::Device::cpu);
  // The CPU kernel also reads half adapters beside float32 activations, widening
  // them as it loads (--lora-dtype below the model's float32: half the bytes).
  const bool half_beside_f32 = !gpu && x.dtype() == mx::float32 && lora_a.dtype() == lora_b.dtype() &&
      (lora_a.dtype() == mx::bfloat16 || lora_a.dtype() == mx::float16);
  if (!half_beside_f32 && (lora_a.dtype() != x.dtype() || lora_b.dtype() != x.dtype())) {
    fail("lora_a and lora_b must have x's dtype " + str(x.dtype()) +
         " (on the CPU, bfloat16 or float16 both, beside float32 x), got " + str(lora_a.dtype()) + " and " +
         str(lora_b.dtype()));
  }
  if (scale.ndim() != 1 || scale.shape(0) != num_slots || !is_linear_float(scale.dtype())) {
    fail("scale must be float [L] = [" + std::to_string(num_slots) + "], got " + str(scale.dtype()) + " " +
         str(scale.shape()));
  }
  mx::Shape out_shape = with_last_dim(x, out);
  if (y) {
    if (y->ndim() != x.ndim() || !std::equal(x.shape().begin(), x.shape().end() - 1, y->shape().begin())) {
      fail("y must be [..., out_cols] with x's leading dimensions " + str(x.shape()) + ", got " + str(y->shape()));
    }
    if (y->dtype() != x.dtype()) fail("y must have x's dtype " + str(x.dtype()) + ", got " + str(y->dtype()));
    if (column_offset < 0 || static_cast<int64_t>(column_offset) + out > y->shape(-1)) {
      fail("the update's columns [column_offset, column_offset + out) = [" + std::to_string(column_offset) + ", " +
           std::to_string(static_cast<int64_t>(column_offset) + out) + ") must lie within y's " +
           std::to_string(y->shape(-1)) + " columns");
    }
    out_shape = y->shape();
  } else if (column_offset != 0) {
    fail("column_offset applies to lora_apply only");
  }

  if (gpu) check_evaluated_idx(idx, num_slots);
  // The CPU task copies strided inputs itself; the Metal kernels index row-contiguous ones.
  auto prep = [&](const mx::array& a) { return gpu ? mx::contiguous(a, false, stream) : a; };
  std::vector<mx::array> inputs = {
      prep(x),
      prep(idx.dtype() == mx::int32 ? idx : mx::astype(idx, mx::int32, stream)),
      lora_a,
      lora_b,
      prep(scale.dtype() == mx::float32 ? scale : mx::astype(scale, mx::float32, stream))};
  if (y) inputs.push_back(prep(*y));
  return mx::array(std::move(out_shape), x.dtype(),
                   std::make_shared<LoraMatmul>(stream, y.has_value(), column_offset), std::move(inputs));
}

} // namespace

mx::array lora_delta(const mx::array& x, const mx::array& idx, const mx::array& lora_a, const mx::array& lora_b,
                     const mx::array& scale, mx::StreamOrDevice s) {
  return build(std::nullopt, x, idx, lora_a, lora_b, scale, 0, s);
}

mx::array lora_apply(const mx::array& y, const mx::array& x, const mx::array& idx, const mx::array& lora_a,
                     const mx::array& lora_b, const mx::array& scale, int column_offset, mx::StreamOrDevice s) {
  return build(y, x, idx, lora_a, lora_b, scale, column_offset, s);
}

bool lora_can_donate(const mx::array& y, const mx::array& out) {
  // As MLX's own element-wise ops decide, plus a whole row-contiguous layout.
  constexpr size_t kDonationSlack = 16384;
  return y.is_donatable() && y.flags().row_contiguous && y.size() == out.size() &&
      y.itemsize() == out.itemsize() && y.buffer_size() <= out.nbytes() + kDonationSlack;
}

void LoraMatmul::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  auto& out = outputs[0];
  const bool in_place = add_ && lora_can_donate(inputs[5], out);
  if (in_place) {
    out.copy_shared_buffer(inputs[5]);
  } else {
    out.set_data(mx::allocator::malloc(out.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream());
  // The task holds pointers only (MLX keeps the inputs' buffers, the encoder
  // the copies): an array held until the task runs would keep y's buffer from
  // the next call of a chain, which could not reuse it then.
  struct Input {
    const void* data;
    std::optional<cpu::StridedLayout> copy_from;
    const char* src;
  };
  std::vector<Input> in;
  in.reserve(inputs.size());
  for (const auto& a : inputs) {
    RowContiguous r = row_contiguous(a, encoder);
    in.push_back({r.view.data<void>(), std::move(r.copy_from), r.src});
  }

  const auto& a = inputs[2];
  cpu::LoraArgs args{};
  args.type = elem_of(out.dtype());
  args.weight_type = elem_of(a.dtype());  // x's, or half beside float32 x (build())
  args.rows = inputs[1].size();
  args.in_features = a.shape(2);
  args.out_features = inputs[3].shape(2);
  args.rank = a.shape(1);
  args.num_slots = a.shape(0);
  args.out_cols = out.shape(-1);
  args.column_offset = column_offset_;
  args.in_place = in_place;
  args.out = out.data<void>();
  args.x = in[0].data;
  args.idx = static_cast<const int32_t*>(in[1].data);
  args.a = in[2].data;
  args.b = in[3].data;
  args.scale = static_cast<const float*>(in[4].data);
  args.y = add_ ? in[5].data : nullptr;
  encoder.dispatch([in = std::move(in), args]() {
    for (const auto& i : in) {
      if (i.copy_from) cpu::copy_to_row_contiguous(i.src, *i.copy_from, static_cast<char*>(const_cast<void*>(i.data)));
    }
    cpu::lora_cpu(args);
  });
}

void LoraMatmul::eval_gpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  // Weights go in as they are; every layout is known only now.
  require_row_contiguous("lora", inputs, {"x", "idx", "lora_a", "lora_b", "scale", "y"});
  const bool in_place = add_ && lora_can_donate(inputs[5], outputs[0]);
  metal::lora_gpu(stream(), inputs, outputs[0], add_, column_offset_, in_place);
#else
  (void)inputs;
  (void)outputs;
  throw std::runtime_error("VllmMetalLora has no GPU implementation on this platform; use the CPU stream.");
#endif
}

bool LoraMatmul::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const LoraMatmul&>(other);
  return add_ == o.add_ && column_offset_ == o.column_offset_;
}

std::vector<mx::Shape> LoraMatmul::output_shapes(const std::vector<mx::array>& inputs) {
  if (add_) return {inputs[5].shape()};
  return {with_last_dim(inputs[0], inputs[3].shape(2))};
}

} // namespace vllm_metal
