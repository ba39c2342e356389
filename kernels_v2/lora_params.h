// Parameter block of the LoRA kernels (lora_shrink, lora_expand), shared
// verbatim by the Metal sources and the host that encodes them (set as bytes
// at buffer(5)). Packed 4-byte scalars: Metal and C++ lay them out alike.
#pragma once

#ifndef __METAL_VERSION__
namespace vllm_metal::kernels {
#endif

struct LoraParams {
  int rows;            // T: rows of x, idx, u and out
  int in_features;     // columns of x and of each A row
  int out_features;    // columns of each B: the segment's width
  int rank;            // r_max: rows of each A and B, columns of u
  int num_slots;       // L: adapter slots; idx outside [0, L) gets no update
  int out_cols;        // columns of out (and y): out_features for a bare delta
  int column_offset;   // out column of segment column 0
  int first_column;    // out column of the expand launch's first thread
  int launch_columns;  // out columns the expand launch covers
};

#ifndef __METAL_VERSION__
}  // namespace vllm_metal::kernels
#endif
