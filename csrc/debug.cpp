#include "debug.h"

#include <stdexcept>

#include "cpu/isa.h"
#include "cpu/thread_pool.h"

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

} // namespace vllm_metal
