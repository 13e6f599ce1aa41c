// Thread-level parallelism for CPU kernels, on llmkern's thread pool (thread_pool.h).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/macros.h"
#include "common/thread_pool.h"

LLMK_NS_BEGIN

inline int max_threads() { return ::llmk::pool_threads(); }

// Calls f(begin, end) on disjoint chunks covering [0, n), one per thread. Runs inline when the
// work is too small (n <= grain) to be worth waking the pool.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  const int64_t nt = std::min<int64_t>(max_threads(), (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (nt <= 1 || ::llmk::pool_in_job()) {
    f(0, n);
    return;
  }
  struct Ctx {
    const F* f;
    int64_t n;
  } ctx{&f, n};
  ::llmk::pool_run(int(nt), [](void* p, int t, int T) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    const int64_t chunk = (c.n + T - 1) / T, b = t * chunk, e = std::min(c.n, b + chunk);
    if (b < e) (*c.f)(b, e);
  }, &ctx);
}

// Dynamic scheduling for items of uneven cost (e.g. ragged sequences): f(i) for i in [0, n).
template <typename F>
inline void parallel_for_dynamic(int64_t n, const F& f) {
  if (n <= 0) return;
  if (n == 1 || max_threads() <= 1 || ::llmk::pool_in_job()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  struct Ctx {
    const F* f;
    int64_t n;
    std::atomic<int64_t> next{0};
  } ctx{&f, n};
  ::llmk::pool_run(int(std::min<int64_t>(max_threads(), n)), [](void* p, int, int) {
    Ctx& c = *static_cast<Ctx*>(p);
    for (int64_t i; (i = c.next.fetch_add(1, std::memory_order_relaxed)) < c.n;) (*c.f)(i);
  }, &ctx);
}

// f(tid, nthreads) on a team of up to `nthreads` threads that may meet at team_barrier().
template <typename F>
inline void parallel_team(int nthreads, const F& f) {
  ::llmk::pool_run(nthreads, [](void* p, int t, int T) { (*static_cast<const F*>(p))(t, T); },
                   const_cast<void*>(static_cast<const void*>(&f)));
}

inline void team_barrier() { ::llmk::pool_barrier(); }

LLMK_NS_END
