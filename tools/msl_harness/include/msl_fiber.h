// Stackful fibers for the harness lanes: one fiber per simulated GPU thread.
//
// x86-64 uses a hand-written switch (callee-saved registers + MXCSR/x87 control
// word, about 20 instructions); ucontext elsewhere, which is correct but
// makes a sigprocmask syscall per switch (roughly 15x slower).
#pragma once

#include <cstdint>

#if defined(__x86_64__) && !defined(MSL_HX_UCONTEXT)
#define MSL_HX_ASM_FIBERS 1
#else
#define MSL_HX_ASM_FIBERS 0
#include <ucontext.h>
#endif

namespace msl_hx {

using FiberEntry = void (*)(void*);

#if MSL_HX_ASM_FIBERS

extern "C" __attribute__((visibility("hidden"))) void msl_hx_switch(void** save_sp, void* load_sp);
extern "C" __attribute__((visibility("hidden"))) void msl_hx_fiber_start();

// Saves the callee-saved state on the current stack, stores the stack pointer in
// *save_sp, loads load_sp and restores the state saved there. A new fiber's
// stack is laid out so that the restore "returns" into msl_hx_fiber_start,
// which calls entry(arg) with r13 = entry and r12 = arg.
asm(R"(
    .text
    .p2align 4
    .globl msl_hx_switch
    .hidden msl_hx_switch
    .type msl_hx_switch,@function
msl_hx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size msl_hx_switch,.-msl_hx_switch

    .p2align 4
    .globl msl_hx_fiber_start
    .hidden msl_hx_fiber_start
    .type msl_hx_fiber_start,@function
msl_hx_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size msl_hx_fiber_start,.-msl_hx_fiber_start
)");

struct Fiber {
  void* sp = nullptr;

  // Prepare a fiber that runs entry(arg) on [stack, stack + size).
  void init(char* stack, size_t size, FiberEntry entry, void* arg) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
    // 8 slots restored by msl_hx_switch; after its `ret` rsp = top - 16 is
    // 16-byte aligned, as the call in msl_hx_fiber_start requires.
    uint64_t* frame = reinterpret_cast<uint64_t*>(top - 80);
    uint32_t csr[2];
    asm volatile("stmxcsr %0" : "=m"(csr[0]));
    asm volatile("fnstcw %0" : "=m"(*reinterpret_cast<uint16_t*>(&csr[1])));
    csr[1] &= 0xffff;
    frame[0] = uint64_t(csr[0]) | (uint64_t(csr[1]) << 32);
    frame[1] = 0;                                       // r15
    frame[2] = 0;                                       // r14
    frame[3] = reinterpret_cast<uint64_t>(entry);       // r13
    frame[4] = reinterpret_cast<uint64_t>(arg);         // r12
    frame[5] = 0;                                       // rbx
    frame[6] = 0;                                       // rbp
    frame[7] = reinterpret_cast<uint64_t>(&msl_hx_fiber_start);
    sp = frame;
  }
};

inline void switch_fiber(Fiber& from, Fiber& to) {
  msl_hx_switch(&from.sp, to.sp);
}

#else  // ucontext

struct Fiber {
  ucontext_t ctx;
  static void trampoline(unsigned hi_entry, unsigned lo_entry, unsigned hi_arg, unsigned lo_arg) {
    auto entry = reinterpret_cast<FiberEntry>((uintptr_t(hi_entry) << 32) | lo_entry);
    void* arg = reinterpret_cast<void*>((uintptr_t(hi_arg) << 32) | lo_arg);
    entry(arg);
  }
  void init(char* stack, size_t size, FiberEntry entry, void* arg) {
    getcontext(&ctx);
    ctx.uc_stack.ss_sp = stack;
    ctx.uc_stack.ss_size = size;
    ctx.uc_link = nullptr;
    uintptr_t e = reinterpret_cast<uintptr_t>(entry), a = reinterpret_cast<uintptr_t>(arg);
    makecontext(&ctx, reinterpret_cast<void (*)()>(&trampoline), 4, unsigned(e >> 32),
                unsigned(e & 0xffffffffu), unsigned(a >> 32), unsigned(a & 0xffffffffu));
  }
};

inline void switch_fiber(Fiber& from, Fiber& to) {
  swapcontext(&from.ctx, &to.ctx);
}

#endif

}  // namespace msl_hx
