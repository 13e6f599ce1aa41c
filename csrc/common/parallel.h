// Thread-level parallelism for CPU kernels (OpenMP when available).
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/macros.h"

LLMK_NS_BEGIN

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Calls f(begin, end) on disjoint chunks covering [0, n). Runs inline when the work is too small
// (n <= grain) to be worth waking the pool.
template <typename F>
inline void parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
#if defined(_OPENMP)
  if (n > grain && max_threads() > 1 && !omp_in_parallel()) {
    const int64_t nthreads = std::min<int64_t>(max_threads(), (n + grain - 1) / std::max<int64_t>(grain, 1));
#pragma omp parallel num_threads(static_cast<int>(nthreads))
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t chunk = (n + nt - 1) / nt;
      const int64_t b = t * chunk, e = std::min(n, b + chunk);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  f(0, n);
}

// Dynamic scheduling for items of uneven cost (e.g. ragged sequences): f(i) for i in [0, n).
template <typename F>
inline void parallel_for_dynamic(int64_t n, const F& f) {
  if (n <= 0) return;
#if defined(_OPENMP)
  if (n > 1 && max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) f(i);
}

LLMK_NS_END
