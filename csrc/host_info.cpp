#include "host_info.h"

#include <stdexcept>

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

bool cpu_amx() {
  return cpu::amx_active();
}

int cpu_threads() {
  return cpu::ThreadPool::instance().size();
}

} // namespace vllm_metal
