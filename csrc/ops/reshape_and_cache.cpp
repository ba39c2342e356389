#include "ops/reshape_and_cache.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "cpu/attention/kv_quant_cpu.h"
#include "cpu/runtime/strided_copy.h"
#include "ops/cpu_inputs.h"
#include "ops/eval_layout.h"
#include "ops/kv_cache_shape.h"
#include "metal/kernel_library.h"
#include "metal/metal_ops.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/utils.h"
#include "platform.h"

namespace vllm_metal {

namespace mx = mlx::core;

namespace {

[[noreturn]] void fail(const std::string& msg) {
  throw std::invalid_argument("reshape_and_cache: " + msg);
}

struct CopyArgs {
  const char* key;
  const char* value;
  char* key_cache;
  char* value_cache;
  const int32_t* slots;
  int64_t num_tokens;
  int64_t num_slots; // num_blocks * block_size
  size_t row_bytes; // num_kv_heads * head_size * itemsize
  // Quantized caches: key/value are float32 rows of num_kv_heads * head_size,
  // each head row written as codes and scale (kv_quant.h).
  KvQuant quant;
  int num_kv_heads;
  int head_size;
  // Float caches: key pages as columns [num_kv_heads * head_size][block_size].
  bool key_columns;
  int64_t block_size;
};

// Token `token`'s key row into column page slot / block_size at lane
// slot % block_size (elements of `bytes` bytes).
template <size_t bytes>
void write_key_columns(const CopyArgs& a, int64_t token, int64_t slot) {
  const int64_t n = static_cast<int64_t>(a.num_kv_heads) * a.head_size;
  const int64_t off = slot % a.block_size;
  const char* src = a.key + token * n * bytes;
  char* dst = a.key_cache + ((slot - off) * n + off) * bytes;
  for (int64_t e = 0; e < n; ++e) std::memcpy(dst + e * a.block_size * bytes, src + e * bytes, bytes);
}

void quantize_slot(const CopyArgs& a, int64_t token, int64_t slot) {
  const int64_t src = token * a.num_kv_heads * a.head_size;
  const int64_t k_dst = slot * a.num_kv_heads * kv_key_width(a.head_size, a.quant);
  const int64_t v_dst = slot * a.num_kv_heads * kv_value_width(a.head_size, a.quant);
  cpu::quantize_token(reinterpret_cast<const float*>(a.key) + src, reinterpret_cast<const float*>(a.value) + src,
                      a.num_kv_heads, a.head_size, a.quant, reinterpret_cast<uint8_t*>(a.key_cache) + k_dst,
                      reinterpret_cast<uint8_t*>(a.value_cache) + v_dst);
}

void copy_rows(const CopyArgs& a) {
  // Check every slot before writing any, so a bad call leaves the cache intact.
  for (int64_t i = 0; i < a.num_tokens; ++i) {
    if (a.slots[i] >= a.num_slots) {
      throw std::out_of_range(
          "reshape_and_cache: slot_mapping[" + std::to_string(i) + "] = " +
          std::to_string(a.slots[i]) + " is outside the cache's " +
          std::to_string(a.num_slots) + " slots (num_blocks * block_size)");
    }
  }
  for (int64_t i = 0; i < a.num_tokens; ++i) {
    const int64_t slot = a.slots[i];
    if (slot < 0) continue; // padding token
    // [num_blocks, block_size, ...] is row-contiguous, so a slot is a row index.
    if (a.quant != KvQuant::None) {
      quantize_slot(a, i, slot);
      continue;
    }
    if (a.key_columns) {
      const size_t item = a.row_bytes / (static_cast<size_t>(a.num_kv_heads) * a.head_size);
      item == 2 ? write_key_columns<2>(a, i, slot) : write_key_columns<4>(a, i, slot);
    } else {
      std::memcpy(a.key_cache + slot * a.row_bytes, a.key + i * a.row_bytes, a.row_bytes);
    }
    std::memcpy(a.value_cache + slot * a.row_bytes, a.value + i * a.row_bytes, a.row_bytes);
  }
}

} // namespace

std::pair<mx::array, mx::array> reshape_and_cache(
    const mx::array& key,
    const mx::array& value,
    const mx::array& key_cache,
    const mx::array& value_cache,
    const mx::array& slot_mapping,
    int kv_quant,
    bool key_columns,
    mx::StreamOrDevice s) {
  if (kv_quant < 0 || kv_quant > kKvQuantLast) {
    fail("kv_quant must be a KvQuant (0-" + std::to_string(kKvQuantLast) + ")");
  }
  const auto quant = static_cast<KvQuant>(kv_quant);
  if (key.ndim() != 3 || value.shape() != key.shape()) {
    fail("key and value must both be [num_tokens, num_kv_heads, head_size]");
  }
  const std::string problem =
      kv_cache_problem(key_cache, value_cache, quant, key.shape(1), key.shape(2), key_columns);
  if (!problem.empty()) fail(problem);
  if (slot_mapping.ndim() != 1 || slot_mapping.shape(0) != key.shape(0)) {
    fail("slot_mapping must be [num_tokens]");
  }
  if (!mx::issubdtype(slot_mapping.dtype(), mx::integer)) {
    fail("slot_mapping must be an integer array");
  }
  auto stream = mx::to_stream(s);
  // The Metal kernel writes row-contiguous caches of a kernel dtype in place;
  // anything else (or no loaded kernels) runs on the CPU. A cache not yet
  // evaluated passes the layout test here; eval_gpu tests it again.
  auto kernel_float = [](mx::Dtype t) { return t == mx::float16 || t == mx::bfloat16 || t == mx::float32; };
  // A quantized write keeps the model's K/V dtype (the kernel reads it); the CPU
  // quantizes float32 rows.
  const bool gpu_ok = metal::kernels_configured() && !key_columns && key_cache.flags().row_contiguous &&
      value_cache.flags().row_contiguous &&
      (quant == KvQuant::None ? kernel_float(key_cache.dtype()) : kernel_float(key.dtype()));
  if (stream.device == mx::Device::gpu && !gpu_ok) stream = mx::default_stream(mx::Device::cpu);
  const auto dtype = key_cache.dtype();
  const bool on_gpu = stream.device == mx::Device::gpu;
  const auto row_dtype = quant == KvQuant::None ? dtype : on_gpu ? key.dtype() : mx::float32;
  auto prep = [&](const mx::array& a, mx::Dtype t) {
    return mx::contiguous(a.dtype() == t ? a : mx::astype(a, t, stream), false, stream);
  };
  // The caches go in as they are: eval_cpu writes into their buffers (not
  // contiguous(), which copies views of larger buffers).
  std::vector<mx::array> inputs = {
      prep(key, row_dtype),
      prep(value, row_dtype),
      key_cache,
      value_cache,
      prep(slot_mapping, mx::int32)};
  auto outs = mx::array::make_arrays(
      {key_cache.shape(), value_cache.shape()},
      {dtype, dtype},
      std::make_shared<ReshapeAndCache>(stream, quant, key_columns),
      inputs);
  return {outs[0], outs[1]};
}

void ReshapeAndCache::eval_cpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  const auto& key = inputs[0];
  // The outputs alias the cache buffers: this is what makes the op in place.
  auto key_layout = alias_cache(inputs[2], outputs[0]);
  auto value_layout = alias_cache(inputs[3], outputs[1]);

  CopyArgs args;
  args.key = key.data<char>();
  args.value = inputs[1].data<char>();
  args.key_cache = outputs[0].data<char>();
  args.value_cache = outputs[1].data<char>();
  args.slots = inputs[4].data<int32_t>();
  args.num_tokens = key.shape(0);
  args.num_slots = static_cast<int64_t>(inputs[3].shape(0)) * inputs[3].shape(1);
  args.row_bytes = static_cast<size_t>(key.shape(1)) * key.shape(2) * key.itemsize();
  args.quant = quant_;
  args.num_kv_heads = key.shape(1);
  args.head_size = key.shape(2);
  args.key_columns = key_columns_;
  args.block_size = inputs[3].shape(1);

  const char* key_src = inputs[2].data<char>();
  const char* value_src = inputs[3].data<char>();

  auto& encoder = mx::cpu::get_command_encoder(stream());
  for (const auto& in : inputs) encoder.set_input_array(in);
  encoder.set_output_array(outputs[0]);
  encoder.set_output_array(outputs[1]);
  encoder.dispatch([args, key_layout, value_layout, key_src, value_src]() {
    if (key_layout) cpu::copy_to_row_contiguous(key_src, *key_layout, args.key_cache);
    if (value_layout) cpu::copy_to_row_contiguous(value_src, *value_layout, args.value_cache);
    copy_rows(args);
  });
}

void ReshapeAndCache::eval_gpu(
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
#if VLLM_METAL_APPLE()
  // The kernel writes the caches in place as row-contiguous: checked now, as the
  // flags read when the op was built describe a cache not yet evaluated as such.
  require_row_contiguous("reshape_and_cache", inputs, {"key", "value", "key_cache", "value_cache", "slot_mapping"});
  metal::reshape_and_cache_gpu(stream(), inputs, outputs, static_cast<int>(quant_));
#else
  (void)inputs;
  (void)outputs;
  throw std::runtime_error("ReshapeAndCache has no GPU implementation on this platform; use the CPU stream.");
#endif
}

std::vector<mx::Shape> ReshapeAndCache::output_shapes(const std::vector<mx::array>& inputs) {
  return {inputs[2].shape(), inputs[3].shape()};
}

} // namespace vllm_metal
