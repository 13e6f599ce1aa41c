// Thread-level parallelism for CPU kernels: OpenMP (shared with torch) or llmkern's own pool, as
// thread_pool.h decides once per process.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/macros.h"
#include "common/thread_pool.h"

LLMK_NS_BEGIN

inline int max_threads() { return ::llmk::pool_threads(); }

inline bool in_parallel() {
#if defined(_OPENMP)
  if (omp_in_parallel()) return true;
#endif
  return ::llmk::pool_in_job();
}

// Calls f(begin, end) on disjoint chunks covering [0, n), one per thread. Runs inline when the
// work is too small (n <= grain) to be worth waking the threads.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  const int64_t nt = std::min<int64_t>(max_threads(), (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (nt <= 1 || in_parallel()) {
    f(0, n);
    return;
  }
  auto run_chunk = [n](int t, int T, const F& g) {
    const int64_t c = (n + T - 1) / T, b = t * c, e = std::min(n, b + c);
    if (b < e) g(b, e);
  };
#if defined(_OPENMP)
  if (::llmk::use_openmp()) {
#pragma omp parallel num_threads(static_cast<int>(nt))
    run_chunk(omp_get_thread_num(), omp_get_num_threads(), f);
    return;
  }
#endif
  struct Ctx {
    const F* f;
    decltype(run_chunk)* run;
  } ctx{&f, &run_chunk};
  ::llmk::pool_run(int(nt), [](void* p, int t, int T) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    (*c.run)(t, T, *c.f);
  }, &ctx);
}

// Dynamic scheduling for items of uneven cost (e.g. ragged sequences): f(i) for i in [0, n).
template <typename F>
inline void parallel_for_dynamic(int64_t n, const F& f) {
  if (n <= 0) return;
  if (n == 1 || max_threads() <= 1 || in_parallel()) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#if defined(_OPENMP)
  if (::llmk::use_openmp()) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(std::min<int64_t>(max_threads(), n)))
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
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
#if defined(_OPENMP)
  if (::llmk::use_openmp() && !in_parallel()) {
#pragma omp parallel num_threads(nthreads)
    f(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  ::llmk::pool_run(nthreads, [](void* p, int t, int T) { (*static_cast<const F*>(p))(t, T); },
                   const_cast<void*>(static_cast<const void*>(&f)));
}

inline void team_barrier() {
#if defined(_OPENMP)
  if (omp_in_parallel()) {
#pragma omp barrier
    return;
  }
#endif
  ::llmk::pool_barrier();
}

LLMK_NS_END
