#include "debug.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal {

std::uintptr_t data_ptr(const mlx::core::array& a) {
  if (a.status() == mlx::core::array::Status::unscheduled) {
    throw std::invalid_argument("data_ptr: array must be evaluated first (mx.eval)");
  }
  const_cast<mlx::core::array&>(a).wait();
  return reinterpret_cast<std::uintptr_t>(a.data<void>());
}

std::string cpu_isa() {
  return cpu::isa_name(cpu::active_isa());
}

void set_cpu_isa(const std::string& name) {
  cpu::set_active_isa(cpu::parse_isa(name));
}

int cpu_threads() {
  return cpu::ThreadPool::instance().size();
}

std::pair<std::vector<int>, long> pool_run(const std::vector<int>& sleep_us) {
  auto& pool = cpu::ThreadPool::instance();
  std::vector<std::atomic<int>> runs(sleep_us.size());
  const long blocked = pool.blocked_joins();
  pool.parallel_for(static_cast<int>(sleep_us.size()), [&](int i) {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us[i]));
    runs[i].fetch_add(1);
  });
  std::vector<int> out;
  for (auto& r : runs) out.push_back(r.load());
  return {out, pool.blocked_joins() - blocked};
}

} // namespace vllm_metal
