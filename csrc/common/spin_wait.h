// Spin-then-give-up waiting for the CPU threads (thread_pool.cpp): a pause on x86, a yield elsewhere,
// and a spin that notices when its core is wanted by another thread.
#pragma once
#include <sched.h>

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMK_PAUSE() _mm_pause()
#else
#define LLMK_PAUSE() std::this_thread::yield()
#endif

namespace llmk {

// Spins until done() or `budget` has passed; false if it gave up. Every ~1 us it looks at the
// clock; every ~8 us it offers the core with sched_yield(), and when that call took long (another
// thread ran meanwhile: this core is wanted) it gives up at once, so the caller goes to sleep.
template <typename Done>
bool spin_until(const Done& done, std::chrono::microseconds budget) {
  if (done()) return true;
  if (budget.count() <= 0) return false;
  const auto start = std::chrono::steady_clock::now();
  auto last_yield = start;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      LLMK_PAUSE();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - start >= budget) return done();
    if (now - last_yield >= std::chrono::microseconds(8)) {
      sched_yield();
      last_yield = std::chrono::steady_clock::now();
      if (last_yield - now >= std::chrono::microseconds(40)) return done();
    }
  }
}

}  // namespace llmk
