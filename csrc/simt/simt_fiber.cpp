#include "simt/simt_fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>

#if !defined(LLMK_SIMT_UCONTEXT)
// x86-64 System V: rbx, rbp, r12-r15 and rsp are callee-saved; everything else is already dead
// across the call. A new fiber's stack is laid out so that the first switch "returns" into
// llmk_simt_fiber_entry with the entry function in rbx and its argument in r12.
extern "C" void llmk_simt_swap(void** save_sp, void* load_sp);
extern "C" void llmk_simt_fiber_entry();
asm(R"(
  .text
  .p2align 4
  .globl llmk_simt_swap
  .hidden llmk_simt_swap
  .type llmk_simt_swap, @function
llmk_simt_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size llmk_simt_swap, .-llmk_simt_swap

  .p2align 4
  .globl llmk_simt_fiber_entry
  .hidden llmk_simt_fiber_entry
  .type llmk_simt_fiber_entry, @function
llmk_simt_fiber_entry:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%rbx
  ud2
  .cfi_endproc
  .size llmk_simt_fiber_entry, .-llmk_simt_fiber_entry
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace llmk {
namespace simt {
namespace emu {

FiberStack::~FiberStack() {
  if (map_) munmap(map_, map_size_);
}

void FiberStack::allocate(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  mprotect(p, page, PROT_NONE);  // guard page: stacks grow down into it
  map_ = static_cast<char*>(p);
  map_size_ = bytes + page;
  base_ = map_ + page;
  size_ = bytes;
}

#if defined(LLMK_SIMT_UCONTEXT)

namespace {
struct Start {
  void (*entry)(void*);
  void* arg;
};
void trampoline(unsigned lo, unsigned hi) {
  const uintptr_t p = (static_cast<uintptr_t>(hi) << 32) | lo;
  const Start* s = reinterpret_cast<const Start*>(p);
  s->entry(s->arg);
}
}  // namespace

void context_start(Context* ctx, FiberStack* stack, void (*entry)(void*), void* arg) {
  // The Start record lives at the top of the fiber's own stack.
  Start* s = reinterpret_cast<Start*>(stack->base() + stack->size() - 64);
  s->entry = entry;
  s->arg = arg;
  getcontext(&ctx->uc);
  ctx->uc.uc_stack.ss_sp = stack->base();
  ctx->uc.uc_stack.ss_size = stack->size() - 128;
  ctx->uc.uc_link = nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(s);
  makecontext(&ctx->uc, reinterpret_cast<void (*)()>(trampoline), 2,
              static_cast<unsigned>(p & 0xffffffffu), static_cast<unsigned>(p >> 32));
}

void context_switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }

#else

void context_start(Context* ctx, FiberStack* stack, void (*entry)(void*), void* arg) {
  // From the saved sp: r15 r14 r13 r12 rbx rbp, return address; after that return the stack
  // pointer must be 16-byte aligned so that the entry's `call` sees the ABI alignment.
  uintptr_t top = reinterpret_cast<uintptr_t>(stack->base() + stack->size()) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 72);
  sp[0] = nullptr;                                            // r15
  sp[1] = nullptr;                                            // r14
  sp[2] = nullptr;                                            // r13
  sp[3] = arg;                                                // r12
  sp[4] = reinterpret_cast<void*>(entry);                     // rbx
  sp[5] = nullptr;                                            // rbp
  sp[6] = reinterpret_cast<void*>(&llmk_simt_fiber_entry);    // return address
  ctx->sp = sp;
}

void context_switch(Context* from, Context* to) { llmk_simt_swap(&from->sp, to->sp); }

#endif

}  // namespace emu
}  // namespace simt
}  // namespace llmk
