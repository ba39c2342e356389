// Execution of a translated kernel: threadgroups on OS threads, lanes as fibers.
//
// A worker thread runs one threadgroup at a time. Every lane runs until it
// reaches a simd_* collective, a barrier or its end; when no lane can run, the
// scheduler releases one waiting collective per simdgroup (all its waiting
// lanes at the same call site) with a frozen snapshot of their values, or, when
// every live lane waits at a threadgroup barrier, the barrier. Anything a GPU
// would leave undefined (partial collectives, barriers after early returns,
// reads from inactive lanes) is counted and described in the launch's error.
#pragma once

#include <sys/mman.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "msl_fiber.h"
#include "msl_types.h"

// ------------------------------------------------------------ C ABI (mirrored by library.py)
extern "C" {
struct msl_hx_constant {
  int32_t index;
  int32_t pad;
  double value;
};

struct msl_hx_launch {
  uint32_t grid[3];     // threadgroups per grid
  uint32_t threads[3];  // threads per threadgroup
  void* const* buffers;
  int32_t num_buffers;
  int32_t num_tg_mem;
  const uint64_t* tg_mem_bytes;  // [[threadgroup(n)]] sizes
  const msl_hx_constant* constants;
  int32_t num_constants;
  int32_t order;  // lane order between sync points: 0 forward, 1 reverse, 2 shuffled
  uint32_t seed;
  int32_t workers;
  int32_t stack_kib;
  int32_t num_guard;
  const uint64_t* guard_lo;  // buffer address ranges, for the out-of-bounds report
  const uint64_t* guard_hi;
  int64_t stats[9];
  char error[1024];
};

struct msl_hx_entry {
  const char* name;
  void (*body)();  // not `kernel`: that word is an empty macro in translated code
  const char* buffers;       // "0,1,4": [[buffer(n)]] indices the kernel binds
  const char* threadgroups;  // [[threadgroup(n)]] indices
};

struct msl_hx_function_constant {
  int32_t index;
  const char* name;
  void (*set)(double);
  bool* defined;
};
}

namespace msl_hx {

using metal::uint3;
constexpr int kSimdWidth = 32;
constexpr int kSlotBytes = 64;  // largest value a collective moves (e.g. float4x4 / 16 floats)

enum Stat {
  kSwitches, kCollectives, kBarriers, kDivergent, kEarlyExit, kBarrierMismatch, kInactiveRead, kThreadgroups,
  kTensorOpMisuse,  // msl_tensor_ops.h: an operand smaller than its tile
  kNumStats
};
static_assert(sizeof(msl_hx_launch::stats) == kNumStats * sizeof(int64_t), "the launch's stats are the Stat list");
enum class State : uint8_t { Ready, AtSimd, AtBarrier, Done };

struct Site {
  const char* file = nullptr;
  int line = 0;
  int kind = 0;
  bool operator==(const Site& o) const { return file == o.file && line == o.line && kind == o.kind; }
  bool operator<(const Site& o) const {
    return line != o.line ? line < o.line : (file != o.file ? file < o.file : kind < o.kind);
  }
};

struct Lane {
  Fiber fiber;
  State state;
  Site site;
  uint32_t index;  // thread_index_in_threadgroup
  uint32_t lane;   // thread_index_in_simdgroup
  uint32_t simdgroup;
  uint3 position;  // thread_position_in_threadgroup
};

struct SimdGroup {
  alignas(64) unsigned char slots[kSimdWidth][kSlotBytes];
  alignas(64) unsigned char snapshot[kSimdWidth][kSlotBytes];
  uint32_t active;  // lanes of the collective being released
  int width;
};

struct Worker {
  msl_hx_launch* launch;
  void (*kernel)();
  std::vector<Lane> lanes;
  std::vector<SimdGroup> groups;
  std::vector<std::vector<unsigned char>> tg_mem;
  char* stacks = nullptr;
  size_t stack_bytes = 0;
  size_t stacks_total = 0;
  Fiber scheduler;
  uint3 group_position;
  long epoch = 0;  // threadgroups run so far: `threadgroup` variables re-poison per epoch
  int64_t stats[kNumStats] = {};
  uint32_t rng = 1;
};

inline thread_local Worker* tl_worker = nullptr;
inline thread_local Lane* tl_lane = nullptr;
inline std::mutex g_error_mutex;

// Append one line to the launch's error text (kept short: the first problems matter).
inline void report(msl_hx_launch* launch, const char* message) {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  size_t used = std::strlen(launch->error);
  if (used + std::strlen(message) + 1 >= sizeof(launch->error)) return;
  std::memcpy(launch->error + used, message, std::strlen(message) + 1);
}

inline std::atomic<long> g_epoch{0};

// ------------------------------------------------------------ lane side
inline void yield_lane() { switch_fiber(tl_lane->fiber, tl_worker->scheduler); }

inline void wait_simd(const Site& site) {
  tl_lane->state = State::AtSimd;
  tl_lane->site = site;
  yield_lane();
}

inline void wait_barrier(const Site& site) {
  tl_lane->state = State::AtBarrier;
  tl_lane->site = site;
  yield_lane();
}

inline void lane_main(void* arg) {
  Lane* lane = static_cast<Lane*>(arg);
  tl_worker->kernel();
  lane->state = State::Done;
  yield_lane();
  __builtin_trap();  // a finished lane is never resumed
}

// ------------------------------------------------------------ scheduler
inline uint32_t next_random(uint32_t& s) {
  s ^= s << 13;
  s ^= s >> 17;
  s ^= s << 5;
  return s;
}

// Release the collective of one simdgroup; false if none of its lanes waits at
// one. Lanes waiting elsewhere or already returned make it partial: reported.
inline bool release_collective(Worker& w, int g) {
  SimdGroup& group = w.groups[g];
  const int base = g * kSimdWidth;
  bool any = false;
  Site first;
  for (int l = 0; l < group.width; ++l) {
    Lane& lane = w.lanes[base + l];
    if (lane.state == State::AtSimd && (!any || lane.site < first)) {
      first = lane.site;
      any = true;
    }
  }
  if (!any) return false;
  uint32_t mask = 0;
  for (int l = 0; l < group.width; ++l) {
    Lane& lane = w.lanes[base + l];
    if (lane.state == State::AtSimd && lane.site == first) mask |= 1u << l;
  }
  const uint32_t full = group.width == 32 ? 0xffffffffu : ((1u << group.width) - 1u);
  if (mask != full) {
    w.stats[kDivergent]++;
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "%s:%d: simdgroup collective reached by only some lanes "
                  "(threadgroup %u,%u,%u, simdgroup %d, active mask %08x)\n",
                  first.file, first.line, w.group_position.x, w.group_position.y, w.group_position.z, g, mask);
    report(w.launch, msg);
  }
  for (int l = 0; l < group.width; ++l)
    if (mask >> l & 1) std::memcpy(group.snapshot[l], group.slots[l], kSlotBytes);
  group.active = mask;
  for (int l = 0; l < group.width; ++l)
    if (mask >> l & 1) w.lanes[base + l].state = State::Ready;
  w.stats[kCollectives]++;
  return true;
}

inline void run_threadgroup(Worker& w, uint3 size) {
  msl_hx_launch* launch = w.launch;
  const int n = int(size.x * size.y * size.z);
  w.epoch = ++g_epoch;
  w.stats[kThreadgroups]++;
  for (int i = 0; i < n; ++i) {
    Lane& lane = w.lanes[i];
    lane.index = uint32_t(i);
    lane.lane = uint32_t(i % kSimdWidth);
    lane.simdgroup = uint32_t(i / kSimdWidth);
    lane.position = uint3(uint(i) % size.x, (uint(i) / size.x) % size.y, uint(i) / (size.x * size.y));
    lane.state = State::Ready;
    char* stack = w.stacks + size_t(i) * w.stack_bytes;
    // The lowest page of each stack is the guard; the fiber gets the rest.
    lane.fiber.init(stack + 4096, w.stack_bytes - 4096, &lane_main, &lane);
  }
  const int num_groups = (n + kSimdWidth - 1) / kSimdWidth;
  for (int g = 0; g < num_groups; ++g) w.groups[g].width = std::min(kSimdWidth, n - g * kSimdWidth);
  for (auto& mem : w.tg_mem) std::memset(mem.data(), 0xff, mem.size());  // poison: NaN / -1

  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = launch->order == 1 ? n - 1 - i : i;
  for (;;) {
    if (launch->order == 2) {
      for (int i = n - 1; i > 0; --i) std::swap(order[i], order[next_random(w.rng) % uint32_t(i + 1)]);
    }
    for (int k = 0; k < n; ++k) {
      Lane& lane = w.lanes[order[k]];
      if (lane.state != State::Ready) continue;
      tl_lane = &lane;
      w.stats[kSwitches]++;
      switch_fiber(w.scheduler, lane.fiber);
    }
    tl_lane = nullptr;
    bool released = false;
    for (int g = 0; g < num_groups; ++g) released |= release_collective(w, g);
    if (released) continue;

    int done = 0, waiting = 0;
    const Lane* first = nullptr;
    bool mismatch = false;
    for (int i = 0; i < n; ++i) {
      const Lane& lane = w.lanes[i];
      if (lane.state == State::Done) {
        done++;
      } else {
        waiting++;
        if (first == nullptr) first = &lane;
        else if (!(lane.site == first->site)) mismatch = true;
      }
    }
    if (waiting == 0) break;
    if (done > 0) {
      w.stats[kEarlyExit]++;
      char msg[320];
      std::snprintf(msg, sizeof msg,
                    "%s:%d: threadgroup_barrier reached after %d lanes returned (threadgroup %u,%u,%u)\n",
                    first->site.file, first->site.line, done, w.group_position.x, w.group_position.y,
                    w.group_position.z);
      report(launch, msg);
    }
    if (mismatch) {
      w.stats[kBarrierMismatch]++;
      char msg[320];
      std::snprintf(msg, sizeof msg, "%s:%d: lanes wait at different barriers or collectives (threadgroup %u,%u,%u)\n",
                    first->site.file, first->site.line, w.group_position.x, w.group_position.y, w.group_position.z);
      report(launch, msg);
    }
    for (auto& lane : w.lanes) {
      if (&lane - w.lanes.data() >= n) break;
      if (lane.state == State::AtBarrier) lane.state = State::Ready;
    }
    w.stats[kBarriers]++;
  }
}

inline void worker_main(msl_hx_launch* launch, void (*kernel)(), std::atomic<uint32_t>* next, int64_t* totals,
                        std::mutex* totals_mutex) {
  Worker w;
  w.launch = launch;
  w.kernel = kernel;
  const uint3 size(launch->threads[0], launch->threads[1], launch->threads[2]);
  const int n = int(size.x * size.y * size.z);
  w.lanes.resize(n);
  w.groups.resize((n + kSimdWidth - 1) / kSimdWidth);
  for (int i = 0; i < launch->num_tg_mem; ++i) w.tg_mem.emplace_back(std::max<uint64_t>(launch->tg_mem_bytes[i], 16));
  w.stack_bytes = size_t(std::max(launch->stack_kib, 16)) * 1024;
  w.stacks_total = w.stack_bytes * size_t(n);
  w.stacks = static_cast<char*>(
      mmap(nullptr, w.stacks_total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (w.stacks == MAP_FAILED) {
    std::fprintf(stderr, "msl harness: cannot map lane stacks\n");
    std::abort();
  }
  for (int i = 0; i < n; ++i) mprotect(w.stacks + size_t(i) * w.stack_bytes, 4096, PROT_NONE);
  w.rng = launch->seed * 2654435761u + 12345u;
  if (w.rng == 0) w.rng = 1;

  static thread_local char alt_stack[1 << 16];
  if (launch->num_guard > 0) {
    stack_t ss;
    ss.ss_sp = alt_stack;
    ss.ss_size = sizeof(alt_stack);
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
  }
  tl_worker = &w;
  const uint32_t gx = launch->grid[0], gy = launch->grid[1], gz = launch->grid[2];
  const uint32_t total = gx * gy * gz;
  for (uint32_t t = next->fetch_add(1); t < total; t = next->fetch_add(1)) {
    w.group_position = uint3(t % gx, (t / gx) % gy, t / (gx * gy));
    run_threadgroup(w, size);
  }
  tl_worker = nullptr;
  munmap(w.stacks, w.stacks_total);
  std::lock_guard<std::mutex> lock(*totals_mutex);
  for (int i = 0; i < kNumStats; ++i) totals[i] += w.stats[i];
}

// ------------------------------------------------------------ out-of-bounds reporter (guard mode)
inline msl_hx_launch* g_guard_launch = nullptr;

// Each buffer sits between two inaccessible pages: a fault in the page after
// (or before) buffer n is an access past its end (or before its start).
inline void guard_handler(int, siginfo_t* info, void*) {
  char buf[512];
  const uint64_t addr = reinterpret_cast<uint64_t>(info->si_addr);
  const uint64_t page = 4096;
  int len = 0;
  msl_hx_launch* launch = g_guard_launch;
  for (int i = 0; launch && i < launch->num_guard && len == 0; ++i) {
    const uint64_t lo = launch->guard_lo[i], hi = launch->guard_hi[i];
    const uint64_t after_end = (hi + page - 1) / page * page + page;
    const uint64_t before_start = lo / page * page - page;
    if (addr >= hi && addr < after_end) {
      len = std::snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): %llu bytes past the end", i,
                          (unsigned long long)(addr - hi));
    } else if (addr >= before_start && addr < lo) {
      len = std::snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): %llu bytes before the start", i,
                          (unsigned long long)(lo - addr));
    }
  }
  if (len == 0) {
    len = std::snprintf(buf, sizeof buf, "invalid memory access at %p (not next to a bound buffer)", info->si_addr);
  }
  Lane* lane = tl_lane;
  Worker* w = tl_worker;
  if (lane && w) {
    const uint3 grid_pos = w->group_position * uint3(w->launch->threads[0], w->launch->threads[1],
                                                     w->launch->threads[2]) + lane->position;
    len += std::snprintf(buf + len, sizeof buf - len,
                         " by thread %u,%u,%u (thread %u,%u,%u of threadgroup %u,%u,%u, simdgroup %u lane %u)\n",
                         grid_pos.x, grid_pos.y, grid_pos.z, lane->position.x, lane->position.y, lane->position.z,
                         w->group_position.x, w->group_position.y, w->group_position.z, lane->simdgroup, lane->lane);
  } else {
    len += std::snprintf(buf + len, sizeof buf - len, "\n");
  }
  if (write(2, buf, size_t(len)) < 0) {
  }
  _exit(77);
}

inline void install_guard_reporter(msl_hx_launch* launch) {
  g_guard_launch = launch;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = guard_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

inline int run_launch(msl_hx_launch* launch, void (*kernel)()) {
  if (launch->num_guard > 0) install_guard_reporter(launch);
  const uint32_t n = launch->threads[0] * launch->threads[1] * launch->threads[2];
  if (n == 0 || n > 1024) {
    std::snprintf(launch->error, sizeof launch->error, "threads per threadgroup must be 1..1024, got %u\n", n);
    return 1;
  }
  const uint32_t total = launch->grid[0] * launch->grid[1] * launch->grid[2];
  int workers = std::max(1, std::min<int>(launch->workers, int(std::max<uint32_t>(total, 1))));
  std::atomic<uint32_t> next{0};
  std::mutex totals_mutex;
  if (workers == 1) {
    worker_main(launch, kernel, &next, launch->stats, &totals_mutex);
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < workers; ++i)
      threads.emplace_back(worker_main, launch, kernel, &next, launch->stats, &totals_mutex);
    for (auto& t : threads) t.join();
  }
  return 0;
}

// ------------------------------------------------------------ built-in values of the current lane
struct Builtins {
  static uint3 thread_position_in_threadgroup() { return tl_lane->position; }
  static uint3 threadgroup_position_in_grid() { return tl_worker->group_position; }
  static uint3 threads_per_threadgroup() {
    auto* l = tl_worker->launch;
    return uint3(l->threads[0], l->threads[1], l->threads[2]);
  }
  static uint3 dispatch_threads_per_threadgroup() { return threads_per_threadgroup(); }
  static uint3 threadgroups_per_grid() {
    auto* l = tl_worker->launch;
    return uint3(l->grid[0], l->grid[1], l->grid[2]);
  }
  static uint3 thread_position_in_grid() {
    return threadgroup_position_in_grid() * threads_per_threadgroup() + thread_position_in_threadgroup();
  }
  static uint3 threads_per_grid() { return threadgroups_per_grid() * threads_per_threadgroup(); }
  static uint3 grid_size() { return threads_per_grid(); }
  static uint thread_index_in_threadgroup() { return tl_lane->index; }
  static uint thread_index_in_simdgroup() { return tl_lane->lane; }
  static uint simdgroup_index_in_threadgroup() { return tl_lane->simdgroup; }
  static uint simdgroups_per_threadgroup() { return uint(tl_worker->groups.size()); }
  static uint dispatch_simdgroups_per_threadgroup() { return simdgroups_per_threadgroup(); }
  static uint threads_per_simdgroup() { return kSimdWidth; }
  static uint thread_execution_width() { return kSimdWidth; }
  static uint thread_index_in_quadgroup() { return tl_lane->index % 4; }
  static uint quadgroup_index_in_threadgroup() { return tl_lane->index / 4; }
};

// A built-in value converted to the declared parameter type (uint, ushort2, uint3 ...).
template <class P>
inline P builtin_as(uint3 v) {
  if constexpr (metal::is_vec<P>::value) {
    P r;
    for (int i = 0; i < metal::components<P>::value; ++i) r[i] = typename P::value_type(v[i]);
    return r;
  } else {
    return P(v.x);
  }
}
template <class P>
inline P builtin_as(uint v) {
  return P(v);
}

// [[buffer(n)]]: pointers are the buffer; references and values read it.
template <class P>
inline P buffer_as(int n) {
  void* p = tl_worker->launch->buffers[n];
  if constexpr (std::is_pointer<P>::value) {
    return static_cast<P>(p);
  } else {
    return *static_cast<std::remove_reference_t<P>*>(p);
  }
}

template <class P>
inline P threadgroup_as(int n) {
  return reinterpret_cast<P>(tl_worker->tg_mem.at(size_t(n)).data());
}

template <class F, int I>
struct param;
template <class R, class... A, int I>
struct param<R (*)(A...), I> {
  using type = std::tuple_element_t<I, std::tuple<A...>>;
};
template <class F, int I>
using param_t = typename param<F, I>::type;

// `threadgroup T x[N];` in a kernel: one copy per OS thread (= per running
// threadgroup), poisoned by the first lane that reaches it in each threadgroup.
struct ThreadgroupVar {
  long epoch = -1;
};
inline void threadgroup_var(void* p, size_t bytes, ThreadgroupVar& var) {
  if (var.epoch != tl_worker->epoch) {
    var.epoch = tl_worker->epoch;
    std::memset(p, 0xff, bytes);
  }
}

}  // namespace msl_hx
