// The CPU thread pool (see thread_pool.h): workers wait on a job generation counter, spinning for
// a bounded time and then sleeping on a condition variable.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LLMK_PAUSE() _mm_pause()
#else
#define LLMK_PAUSE() std::this_thread::yield()
#endif

namespace llmk {
namespace {

thread_local bool t_in_job = false;
thread_local int t_team = 1;  // threads of the job this thread is in

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  const int v = std::atoi(s);
  return v > 0 ? v : fallback;
}

int default_threads() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return env_int("OMP_NUM_THREADS", std::max(1, CPU_COUNT(&set)));
#endif
  return env_int("OMP_NUM_THREADS", std::max(1u, std::thread::hardware_concurrency()));
}

// Spins until done() or `budget` has passed, pausing, and giving the core to any other runnable
// thread every few hundred spins (a spinning worker must not stall the caller's own next work).
template <typename Done>
bool spin_until(const Done& done, std::chrono::microseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    LLMK_PAUSE();
    if ((i & 255) == 0) {
      sched_yield();
      if (std::chrono::steady_clock::now() >= until) return done();
    }
  }
}

class Pool {
 public:
  explicit Pool(int nthreads) : spin_(env_int("LLMKERN_SPIN_US", 300)) {
    nthreads = std::min(nthreads, 0xffff);
    for (int t = 1; t < nthreads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return int(workers_.size()) + 1; }

  bool try_run(int nthreads, TeamFn fn, void* ctx) {
    std::unique_lock<std::mutex> own(run_mu_, std::try_to_lock);
    if (!own.owns_lock()) return false;
    nthreads = std::min(nthreads, size());
    fn_ = fn;
    ctx_ = ctx;
    error_ = nullptr;
    pending_.store(nthreads - 1);
    {  // under the mutex: a worker between its last check and its wait cannot miss the bump
      std::lock_guard<std::mutex> g(mu_);
      ++seq_;
      gen_.store(seq_ << 16 | uint64_t(nthreads));  // one word: a worker sees both or neither
    }
    cv_.notify_all();
    run_member(0, nthreads);
    spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; }, std::chrono::hours(1));
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  void barrier() {
    const uint32_t g = bar_gen_.load(std::memory_order_acquire);
    if (bar_count_.fetch_add(1, std::memory_order_acq_rel) + 1 == t_team) {
      bar_count_.store(0, std::memory_order_relaxed);
      bar_gen_.fetch_add(1, std::memory_order_release);
    } else {
      spin_until([&] { return bar_gen_.load(std::memory_order_acquire) != g; }, std::chrono::hours(1));
    }
  }

 private:
  void run_member(int t, int n) {
    t_in_job = true;
    t_team = n;
    try {
      fn_(ctx_, t, n);
    } catch (...) {
      std::lock_guard<std::mutex> g(err_mu_);
      if (!error_) error_ = std::current_exception();
    }
    t_in_job = false;
    t_team = 1;
  }

  void work(int t) {
    uint64_t seen = 0;
    for (;;) {
      auto fresh = [&] { return gen_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(fresh, spin_)) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || fresh(); });
        if (stop_) return;
      }
      // The job's fields are read only by its members, and the caller waits for all members
      // before it writes the next job's: a thread not in this job must not look at them.
      seen = gen_.load(std::memory_order_acquire);
      const int n = int(seen & 0xffff);
      if (t < n) {
        run_member(t, n);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
  }

  const std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;      // sleeping workers
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t seq_ = 0;
  std::atomic<uint64_t> gen_{0};  // job sequence number << 16 | its thread count
  std::atomic<int> pending_{0};
  TeamFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex err_mu_;
  std::exception_ptr error_;
  std::atomic<int> bar_count_{0};
  std::atomic<uint32_t> bar_gen_{0};
};

std::mutex g_mu;  // creation and resizing
Pool* g_pool = nullptr;
std::atomic<int> g_threads{0};

bool decide_openmp() {
#if defined(_OPENMP)
  const char* mode = std::getenv("LLMKERN_THREADS");
  if (mode && std::string(mode) == "pool") return false;
  if (mode && std::string(mode) == "openmp") return true;
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (!policy) return true;
  std::string p(policy);
  for (auto& c : p) c = char(std::tolower(static_cast<unsigned char>(c)));
  return p != "passive";
#else
  return false;
#endif
}
std::atomic<int> g_openmp{-1};  // -1: not decided yet

// After fork() only the forking thread exists: the child starts a pool of its own when it first
// needs one, leaves the parent's (whose threads it does not have) alone, and stays off OpenMP,
// whose runtime hangs in a child whose parent had used it.
void forget_pool_in_child() {
  new (&g_mu) std::mutex();
  g_pool = nullptr;
  g_openmp.store(0);
}

void register_fork_handler() {
  static bool once = [] { return pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0; }();
  (void)once;
}

Pool& pool() {
  Pool* p = g_pool;
  if (p) return *p;
  std::lock_guard<std::mutex> g(g_mu);
  if (!g_pool) {
    register_fork_handler();
    g_pool = new Pool(pool_threads());  // never deleted: workers sleep through interpreter exit
  }
  return *g_pool;
}

}  // namespace

bool use_openmp() {
  int v = g_openmp.load(std::memory_order_relaxed);
  if (v < 0) {
    register_fork_handler();
    v = decide_openmp() ? 1 : 0;
    g_openmp.store(v);
  }
  return v == 1;
}

int pool_threads() {
  int n = g_threads.load();
  if (n == 0) {
#if defined(_OPENMP)
    n = use_openmp() ? omp_get_max_threads() : default_threads();
#else
    n = default_threads();
#endif
    g_threads.store(n);
  }
  return n;
}

void set_pool_threads(int n) {
  std::lock_guard<std::mutex> g(g_mu);
  g_threads.store(std::max(1, n));
#if defined(_OPENMP)
  omp_set_num_threads(std::max(1, n));
#endif
  if (g_pool && g_pool->size() != n) {
    delete g_pool;  // joins its workers; the next job starts a pool of the new size
    g_pool = nullptr;
  }
}

void pool_run(int nthreads, TeamFn fn, void* ctx) {
  if (nthreads > 1 && !t_in_job && pool().try_run(nthreads, fn, ctx)) return;
  const bool outer = t_in_job;
  const int outer_team = t_team;
  t_in_job = true;  // a team of one: barriers are no-ops, nested loops run inline
  t_team = 1;
  struct Restore {
    bool j;
    int n;
    ~Restore() { t_in_job = j, t_team = n; }
  } restore{outer, outer_team};
  fn(ctx, 0, 1);
}

void pool_barrier() {
  if (t_team > 1) g_pool->barrier();
}

bool pool_in_job() { return t_in_job; }

}  // namespace llmk
