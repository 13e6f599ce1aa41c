// Fibers for the SIMT emulator: stacks and a minimal context switch. On x86-64 the switch saves
// only the callee-saved registers (a few ns); elsewhere it falls back to ucontext (which costs a
// signal-mask system call per switch). All fibers share the OS thread's FP environment.
#pragma once
#include <cstddef>

#if !defined(__x86_64__) && !defined(LLMK_SIMT_UCONTEXT)
#define LLMK_SIMT_UCONTEXT 1
#endif
#if defined(LLMK_SIMT_UCONTEXT)
#include <ucontext.h>
#endif

namespace llmk {
namespace simt {
namespace emu {

// One fiber stack: mmap'd with a guard page below it, so an overflow faults instead of
// corrupting a neighbour.
class FiberStack {
 public:
  FiberStack() = default;
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  ~FiberStack();
  void allocate(size_t bytes);  // throws std::bad_alloc
  char* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  char* map_ = nullptr;
  char* base_ = nullptr;
  size_t size_ = 0, map_size_ = 0;
};

// An execution context: either a fiber (started with start()) or the launching thread's own.
struct Context {
#if defined(LLMK_SIMT_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
};

// Prepare `ctx` to run entry(arg) on `stack` when first switched to. entry must never return.
void context_start(Context* ctx, FiberStack* stack, void (*entry)(void*), void* arg);
// Save the current context into `from` and resume `to`.
void context_switch(Context* from, Context* to);

}  // namespace emu
}  // namespace simt
}  // namespace llmk
