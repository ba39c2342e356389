#include "ops/embedding_gather.h"

#include <stdexcept>
#include <string>

#include "cpu/linear/linear_cpu.h"
#include "ops/cpu_inputs.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("embedding_gather: " + msg);
}

mx::Shape gathered_shape(const mx::array& ids, int d) {
  mx::Shape shape = ids.shape();
  shape.push_back(d);
  return shape;
}

int row_width(const mx::array& table, int bits) {
  return bits == 0 ? table.shape(1) : table.shape(1) * (32 / bits);
}

} // namespace

mx::array embedding_gather(
    const mx::array& ids,
    const mx::array& table,
    const std::optional<mx::array>& scales,
    const std::optional<mx::array>& biases,
    int bits,
    int group_size,
    bool tiled,
    mx::StreamOrDevice s) {
  if (!mx::issubdtype(ids.dtype(), mx::integer)) fail("ids must be an integer array");
  if (table.ndim() != 2) fail("table must be 2-D [V, D] (or [V, D * bits / 32] quantized)");
  auto stream = mx::to_stream(s);
  const bool quantized = scales.has_value();
  if (quantized != biases.has_value()) fail("scales and biases come together");
  std::vector<mx::array> inputs = {
      ids.dtype() == mx::int32 ? ids : mx::astype(ids, mx::int32, stream), table};
  mx::Dtype out_type = table.dtype();
  if (quantized) {
    if (bits != 4 && bits != 8) fail("bits must be 4 or 8");
    if (group_size != 32 && group_size != 64 && group_size != 128) {
      fail("group_size must be 32, 64 or 128");
    }
    if (table.dtype() != mx::uint32) fail("a quantized table must be uint32");
    if (scales->ndim() != 2 || !is_linear_float(scales->dtype()) ||
        biases->shape() != scales->shape() || biases->dtype() != scales->dtype()) {
      fail("scales and biases must be float [V, D / group_size], same dtype");
    }
    const int64_t d = row_width(table, bits);
    if (scales->shape(0) != table.shape(0) ||
        static_cast<int64_t>(scales->shape(1)) * group_size != d) {
      fail("shapes of table [V, D * bits / 32] and scales [V, D / group_size] disagree");
    }
    inputs.push_back(*scales);
    inputs.push_back(*biases);
    out_type = scales->dtype();
  } else {
    if (!is_linear_float(table.dtype())) fail("a dense table must be float");
    if (tiled) fail("tiled applies to a quantized table only");
    bits = 0;
    group_size = 0;
  }
  const int d = row_width(table, bits);
  return mx::array(
      gathered_shape(ids, d),
      out_type,
      std::make_shared<EmbeddingGather>(stream, bits, group_size, tiled),
      std::move(inputs));
}

void EmbeddingGather::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const int bits = bits_, group_size = group_size_;
  const bool tiled = tiled_;
  const cpu::Elem out_type = elem_of(outputs[0].dtype());
  dispatch_on_rows(stream(), inputs, outputs[0],
                   [bits, group_size, tiled, out_type](const std::vector<RowContiguous>& in, void* dst) {
    const int32_t* ids = in[0].view.data<int32_t>();
    const int64_t t = in[0].view.size();
    const auto& table = in[1].view;
    if (bits == 0) {
      cpu::embedding_gather_dense_cpu(
          {table.data<void>(), elem_of(table.dtype()), table.shape(0), table.shape(1)}, ids, t,
          dst);
      return;
    }
    const auto& scales = in[2].view;
    cpu::QuantMatrix w{table.data<uint32_t>(), scales.data<void>(), in[3].view.data<void>(),
                       elem_of(scales.dtype()), bits, group_size, table.shape(0),
                       row_width(table, bits)};
    w.tiled = tiled;
    cpu::embedding_gather_quant_cpu(w, ids, t, dst, out_type);
  });
}

bool EmbeddingGather::is_equivalent(const mx::Primitive& other) const {
  const auto& o = static_cast<const EmbeddingGather&>(other);
  return bits_ == o.bits_ && group_size_ == o.group_size_ && tiled_ == o.tiled_;
}

std::vector<mx::Shape> EmbeddingGather::output_shapes(const std::vector<mx::array>& inputs) {
  return {gathered_shape(inputs[0], row_width(inputs[1], bits_))};
}

} // namespace vllm_metal
