#include "debug.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "cpu/runtime/isa.h"
#include "cpu/runtime/thread_pool.h"

namespace vllm_metal {

void set_cpu_isa(const std::string& name) {
  cpu::set_active_isa(cpu::parse_isa(name));
}

void set_cpu_amx(bool on) {
  cpu::set_amx_active(on);
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
