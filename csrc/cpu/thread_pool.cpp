#include "cpu/thread_pool.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <sched.h>
#endif
#include <unistd.h>

namespace vllm_metal::cpu {

namespace {

int hardware_threads() {
#if defined(__linux__)
  // Honour CPU affinity / cgroup cpusets, which hardware_concurrency ignores.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

} // namespace

int configured_threads() {
  const char* raw = std::getenv("VLLM_METAL_CPU_THREADS");
  if (raw == nullptr || *raw == '\0') return hardware_threads();
  char* end = nullptr;
  long v = std::strtol(raw, &end, 10);
  if (end == raw || *end != '\0' || v < 0 || v > 4096) {
    throw std::invalid_argument(
        std::string("VLLM_METAL_CPU_THREADS must be an integer >= 0 "
                    "(0 = one per hardware thread), got '") + raw + "'");
  }
  return v == 0 ? hardware_threads() : static_cast<int>(v);
}

ThreadPool& ThreadPool::instance() {
  // Leaked on purpose: joining threads during static destruction can hang
  // while MLX's own threads are still finishing work.
  static std::mutex mtx;
  static ThreadPool* pool = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lk(mtx);
  if (pool == nullptr || owner != getpid()) {
    pool = new ThreadPool(configured_threads());
    owner = getpid();
  }
  return *pool;
}

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
    workers_.back().detach();
  }
}

void ThreadPool::run_items() {
  for (;;) {
    int i;
    {
      std::lock_guard<std::mutex> lk(mtx_);
      if (next_ >= n_ || error_) return;
      i = next_++;
    }
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mtx_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  unsigned long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mtx_);
      work_cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
    }
    run_items();
    {
      std::lock_guard<std::mutex> lk(mtx_);
      --pending_workers_;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mtx_);
  {
    std::lock_guard<std::mutex> lk(mtx_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    error_ = nullptr;
    pending_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    // Every worker must leave this job before fn goes out of scope.
    std::unique_lock<std::mutex> lk(mtx_);
    done_cv_.wait(lk, [&] { return pending_workers_ == 0; });
    error = error_;
    fn_ = nullptr;
    n_ = 0;
  }
  if (error) std::rethrow_exception(error);
}

} // namespace vllm_metal::cpu
