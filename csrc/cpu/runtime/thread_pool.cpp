#include "cpu/runtime/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <pthread.h>
#if defined(__linux__)
#include <sched.h>
#endif
#include <unistd.h>

namespace vllm_metal::cpu {

namespace {

// How long an idle worker spins before sleeping, and how long the caller spins
// at a join before blocking: longer than the gaps between the jobs of one
// forward and than a join's usual imbalance (a few microseconds). On 2 cores,
// a wait longer than that means the thread awaited was preempted (vLLM's
// Python, the API server); a spinning waiter then holds the other core, while
// a sleeping one leaves it to that thread, or to the Python that preempted
// it. Served single-stream TPOT (SmolLM2, int8 activations), against the
// earlier 200 us worker spin and a join that never blocked: 3-7% lower in
// five interleaved rounds one hour, level in two the next.
constexpr auto kSpin = std::chrono::microseconds(30);
// Both spin loops yield the core every this many polls (~1-2 us). On 2 cores a
// third runnable thread (Python, a woken worker) often lands on a spinning
// thread's core; without the yield the caller and a worker sharing one core
// took turns of a whole kSpin per job. With nothing else runnable a yield
// returns at once.
constexpr int kPollsPerYield = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

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

namespace {

// The process's pool, and whether this process is a fork of the one that made
// it (the child has the parent's pool object but none of its threads). Set by
// an atfork handler: asking getpid() on every call cost a system call per
// parallel loop, ~1000 per decode step.
std::atomic<ThreadPool*> g_pool{nullptr};
std::atomic<bool> g_forked{false};

void mark_forked() {
  g_forked.store(true, std::memory_order_relaxed);
}

} // namespace

ThreadPool& ThreadPool::instance() {
  ThreadPool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr && !g_forked.load(std::memory_order_relaxed)) return *pool;
  static std::mutex mtx;
  std::lock_guard<std::mutex> lk(mtx);
  static const bool registered = pthread_atfork(nullptr, nullptr, mark_forked) == 0;
  (void)registered;
  pool = g_pool.load(std::memory_order_relaxed);
  if (pool == nullptr || g_forked.load(std::memory_order_relaxed)) {
    // Leaked on purpose (the parent's too, in a child): joining threads during
    // static destruction can hang while MLX's own threads are still finishing work.
    pool = new ThreadPool(configured_threads());
    g_forked.store(false, std::memory_order_relaxed);
    g_pool.store(pool, std::memory_order_release);
  }
  return *pool;
}

ThreadPool::ThreadPool(int num_threads) {
  // A worker starts from the generation of its creation, so a job submitted
  // before the thread first runs is not taken for an old one.
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, seen = generation_.load()] { worker_loop(seen); });
    workers_.back().detach();
  }
}

void ThreadPool::run_items() {
  for (;;) {
    const int i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mtx_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_, std::memory_order_relaxed); // stop handing out items
    }
  }
}

void ThreadPool::worker_loop(unsigned long seen) {
  for (;;) {
    // Spin first: the next job of a forward usually comes within microseconds.
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      cpu_relax();
      if (++polls % kPollsPerYield != 0) continue;
      if (std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lk(sleep_mtx_);
        work_cv_.wait(lk, [&] { return generation_.load() != seen; });
      } else {
        std::this_thread::yield();
      }
    }
    seen = generation_.load();
    active_.fetch_add(1);
    if (open_.load()) run_items();
    // seq_cst with the joiner's store of joiner_sleeping_: either this sees it
    // set, or the joiner's wait predicate sees active_ at 0.
    if (active_.fetch_sub(1) == 1 && joiner_sleeping_.load()) {
      { std::lock_guard<std::mutex> lk(join_mtx_); }
      join_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mtx_);
  fn_ = &fn;
  n_ = n;
  next_.store(0);
  error_ = nullptr;
  open_.store(true);
  {
    // Under the sleep mutex, so a worker about to sleep sees the new job.
    std::lock_guard<std::mutex> lk(sleep_mtx_);
    generation_.fetch_add(1);
  }
  work_cv_.notify_all();
  run_items();
  // Every item is claimed; close the job and wait for the workers inside it
  // (seq_cst: a worker either sees the job closed or is counted in active_).
  open_.store(false);
  // A worker still inside was usually just slower by a few microseconds; if it
  // was preempted instead (other processes share the cores), block (see kSpin).
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  for (int polls = 1; active_.load() != 0; ++polls) {
    if (polls % kPollsPerYield != 0) {
      cpu_relax();
    } else if (std::chrono::steady_clock::now() > spin_until) {
      std::unique_lock<std::mutex> lk(join_mtx_);
      joiner_sleeping_.store(true);
      join_cv_.wait(lk, [&] { return active_.load() == 0; });
      joiner_sleeping_.store(false);
      blocked_joins_.fetch_add(1, std::memory_order_relaxed);
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void parallel_ranges(int64_t n, int items, const std::function<void(int64_t, int64_t)>& fn) {
  if (items <= 1 || n < 2) {
    fn(0, n);
    return;
  }
  ThreadPool::instance().parallel_for(items, [&](int i) { fn(n * i / items, n * (i + 1) / items); });
}

} // namespace vllm_metal::cpu
