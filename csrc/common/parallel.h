// Thread-level parallelism for CPU kernels: llmkern's pool or OpenMP, as thread_pool.h decides
// once per process.
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

// Chunks per thread of a pool parallel_for: a thread that is not running leaves its chunks to the
// others, and uneven progress (a core shared with another process) evens out.
constexpr int64_t kChunksPerThread = 4;

// Calls f(begin, end) on disjoint chunks covering [0, n). Runs inline when the work is too small
// (n <= grain) to be worth waking the threads. Chunks are never smaller than grain (but the last).
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t nt = std::min<int64_t>(max_threads(), (n + grain - 1) / grain);
  if (nt <= 1 || in_parallel()) {
    f(0, n);
    return;
  }
#if defined(_OPENMP)
  if (::llmk::use_openmp()) {
#pragma omp parallel num_threads(static_cast<int>(nt))
    {
      const int t = omp_get_thread_num(), T = omp_get_num_threads();
      const int64_t c = (n + T - 1) / T, b = t * c, e = std::min(n, b + c);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  const int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, nt * kChunksPerThread);
  struct Ctx {
    const F* f;
    int64_t n, size;
  } ctx{&f, n, (n + chunks - 1) / chunks};
  const int nchunks = int((n + ctx.size - 1) / ctx.size);
  ::llmk::pool_for(nchunks, int(nt), [](void* p, int i, int) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    const int64_t b = i * c.size;
    (*c.f)(b, std::min(c.n, b + c.size));
  }, &ctx);
}

// Dynamic scheduling for items of uneven cost (e.g. ragged sequences): f(i) for i in [0, n), taken
// in order by whichever thread is free.
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
    int64_t n, per;
  } ctx{&f, n, (n + (1 << 20) - 1) >> 20};  // items per chunk: 1 unless there are over 2^20
  ::llmk::pool_for(int((n + ctx.per - 1) / ctx.per), int(std::min<int64_t>(max_threads(), n)),
                   [](void* p, int i, int) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    for (int64_t k = i * c.per, e = std::min(c.n, k + c.per); k < e; ++k) (*c.f)(k);
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
