// Host scratch of the CPU kernels, counted.
//
// The memory budget sizes a step's activations from a profiling forward, and
// MLX's counters see only its own arrays: the buffers a kernel allocates for
// itself (the decoder stack's per-step activations, quantized copies of a
// linear layer's input, thread-local panels kept between calls) would be
// missing from it. Every token-proportional buffer goes through here instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace vllm_metal::cpu {

void scratch_count(int64_t bytes);  // + on allocation, - on release

// (live, peak) bytes: allocated now, and the most live at once since the last reset.
// reset_peak=true first makes the peak the live figure.
std::pair<int64_t, int64_t> scratch_bytes(bool reset_peak = false);

// std::allocator that counts; value-initializes as std::vector always does.
template <class T>
struct CountedAllocator {
  using value_type = T;
  CountedAllocator() = default;
  template <class U>
  CountedAllocator(const CountedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    T* p = std::allocator<T>().allocate(n);
    scratch_count(static_cast<int64_t>(n * sizeof(T)));
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    std::allocator<T>().deallocate(p, n);
    scratch_count(-static_cast<int64_t>(n * sizeof(T)));
  }
  template <class U>
  bool operator==(const CountedAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CountedAllocator<U>&) const noexcept { return false; }
};

template <class T>
using ScratchVector = std::vector<T, CountedAllocator<T>>;

// An uninitialized counted array (the new T[n] it replaces did not zero either).
struct ScratchFree {
  int64_t bytes = 0;
  template <class T>
  void operator()(T* p) const noexcept {
    delete[] p;
    scratch_count(-bytes);
  }
};

template <class T>
using ScratchArray = std::unique_ptr<T[], ScratchFree>;

template <class T>
ScratchArray<T> scratch_array(int64_t n) {
  ScratchArray<T> p(new T[n], ScratchFree{static_cast<int64_t>(n * sizeof(T))});
  scratch_count(static_cast<int64_t>(n * sizeof(T)));
  return p;
}

}  // namespace vllm_metal::cpu
