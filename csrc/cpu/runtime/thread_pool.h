// A small fork-aware thread pool owned by the extension.
//
// MLX runs each CPU primitive on one stream thread; the attention kernel uses
// this pool to spread its work items over all cores. Created once, sized by
// VLLM_METAL_CPU_THREADS (0 or unset: one per available hardware thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vllm_metal::cpu {

class ThreadPool {
 public:
  // The process-wide pool; rebuilt lazily in a forked child, whose copy of the
  // parent's pool has no threads.
  static ThreadPool& instance();

  // Participants in parallel_for: the worker threads plus the caller.
  int size() const {
    return static_cast<int>(workers_.size()) + 1;
  }

  // Run fn(i) for i in [0, n) on all participants; returns when all are done.
  // The first exception thrown by any fn is rethrown here.
  void parallel_for(int n, const std::function<void(int)>& fn);

  // Joins so far at which the caller outlasted its spin and blocked.
  long blocked_joins() const {
    return blocked_joins_.load(std::memory_order_relaxed);
  }

 private:
  explicit ThreadPool(int num_threads);
  void worker_loop(unsigned long seen);
  void run_items();

  std::vector<std::thread> workers_;
  std::mutex submit_mtx_; // one job at a time (MLX may run several streams)

  // Workers spin on generation_ for a while after each job (kSpin in
  // thread_pool.cpp says how long and why), then sleep on work_cv_.
  std::mutex sleep_mtx_;
  std::condition_variable work_cv_;
  std::atomic<unsigned long> generation_{0};

  // Current job. A worker joins it only while open_ (checked after raising
  // active_), so the caller can return as soon as open_ is cleared and active_
  // drains, without waiting for workers that never woke.
  const std::function<void(int)>* fn_ = nullptr;
  int n_ = 0;
  std::atomic<int> next_{0};
  std::atomic<bool> open_{false};
  std::atomic<int> active_{0};
  // The caller blocks here at a join that outlasts its spin; the last worker
  // out wakes it when joiner_sleeping_ is set.
  std::mutex join_mtx_;
  std::condition_variable join_cv_;
  std::atomic<bool> joiner_sleeping_{false};
  std::atomic<long> blocked_joins_{0};
  std::mutex error_mtx_;
  std::exception_ptr error_;
};

// fn(begin, end) over [0, n) cut into `items` contiguous ranges, run on the
// pool (on the caller alone when items <= 1).
void parallel_ranges(int64_t n, int items, const std::function<void(int64_t, int64_t)>& fn);

// Number of threads VLLM_METAL_CPU_THREADS asks for (hardware count if 0/unset).
int configured_threads();

} // namespace vllm_metal::cpu
