// The CPU thread pool (see thread_pool.h).
//
// Built for cores that other processes also use. A kernel's work is cut into more chunks than
// threads and every thread, the caller included, claims chunks from one counter: a worker that is
// not running (preempted, or still waking up) simply gets none, and the caller does its share
// instead of waiting a scheduler quantum for it. Every wait spins only briefly and then sleeps on
// a futex; a spinning thread gives up early when sched_yield() shows that another thread wanted
// its core (the machine is oversubscribed), so an idle worker never holds a core a peer needs.
#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
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

#include "common/cpu_quota.h"
#include "common/errors.h"
#include "common/spin_wait.h"
#include "common/stall_guard.h"
#include "common/thread_placement.h"

namespace llmk {
namespace {

using Clock = std::chrono::steady_clock;

int64_t since_start_ns() {
  static const Clock::time_point start = Clock::now();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

struct Stats {
  std::atomic<int64_t> jobs{0}, chunks{0}, worker_chunks{0}, solo_jobs{0}, stalls{0}, wait_ns{0}, stall_wait_ns{0};
  std::atomic<int64_t> worker_jobs{0}, colocated{0}, nudges{0};
} g_stats;

thread_local bool t_in_job = false;
std::mutex g_placement_mu;  // held by a nudging worker, or while the threads' masks change
thread_local int t_team = 1;  // threads of the team job this thread is in (1: none)

int env_int(const char* name, int fallback, int lo = 1) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  const int v = std::atoi(s);
  return v >= lo ? v : fallback;
}

double env_double(const char* name, double fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::atof(s) : fallback;
}

// ---- futex-backed wait/notify -------------------------------------------------------------------
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  if (word->load() == expected) std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

// Threads block in wait(pred) until pred() holds; whoever makes pred true calls notify(), which
// costs a system call only when somebody is asleep.
class Signal {
 public:
  void notify() {
    seq_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) > 0) futex_wake_all(&seq_);
  }
  template <typename Pred>
  void wait(const Pred& pred) {
    while (!pred()) {
      const uint32_t s = seq_.load(std::memory_order_seq_cst);
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      if (!pred()) futex_wait(&seq_, s);  // returns at once if a notify() came after the load
      waiters_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<uint32_t> seq_{0};
  std::atomic<int> waiters_{0};
};

class Pool {
 public:
  explicit Pool(int nthreads)
      : idle_spin_(env_int("LLMKERN_SPIN_US", 300, 0)),
        join_spin_(env_int("LLMKERN_JOIN_SPIN_US", 50, 0)),
        guard_(env_int("LLMKERN_ADAPTIVE_THREADS", 1, 0) != 0),
        placement_(placement_from_env()),
        min_idle_(env_double("LLMKERN_PLACEMENT_IDLE", 0.5)) {
    nthreads = std::max(1, std::min(nthreads, 1024));
    cpus_ = std::vector<std::atomic<int>>(size_t(nthreads));
    for (auto& c : cpus_) c.store(-1);
    for (int t = 1; t < nthreads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  ~Pool() {
    stop_.store(true);
    job_sig_.notify();
    for (auto& w : workers_) w.join();
  }
  int size() const { return int(cpus_.size()); }  // fixed before the workers start: they read it

  // team: the n slots are the members of one team (each run by its own thread, all at once,
  // barriers allowed); otherwise they are chunks that any thread may take, in any number.
  bool try_run(int n, bool team, TeamFn fn, void* ctx) {
    std::unique_lock<std::mutex> own(run_mu_, std::try_to_lock);
    if (!own.owns_lock()) return false;
    if (guard_.solo_now(since_start_ns())) {  // a worker stalled a recent job: the caller runs this one alone
      g_stats.solo_jobs.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (team) n = std::min(n, size());
    // Close the previous job before its fields change. A worker that comes late to it (woken
    // late, preempted, nudged) may have read claim_ while its last slot was taken and read n_
    // after this job's larger n was written: without the close its exchange would then succeed
    // on the old claim word and run a slot of a finished job, on this job's fn and a stale ctx,
    // counted into this job's done_ (a join that never ends, or a slot run on a dead frame).
    // n_ is released after the close, so whoever sees the new n_ fails the exchange.
    claim_.store(claim_.load(std::memory_order_relaxed) | kClosed, std::memory_order_relaxed);
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_release);
    team_.store(team, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    cpus_[0].store(current_cpu(), std::memory_order_relaxed);  // where the workers should not be
    const uint64_t seq = ++seq_ & 0xffffffffu;
    // The caller takes slot 0 before publishing: a team's member 0 is always the caller.
    claim_.store(seq << 32 | 1u, std::memory_order_release);
    job_sig_.notify();
    const auto t0 = Clock::now();
    run_slot(0, n, team);
    int own_chunks = 1;
    if (!team)
      for (int64_t i; (i = claim(seq)) >= 0; ++own_chunks) run_slot(int(i), n, false);
    const auto t1 = Clock::now();
    auto all_done = [&] { return done_.load(std::memory_order_acquire) == n; };
    if (!spin_until(all_done, join_spin_)) done_sig_.wait(all_done);
    const int64_t own_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    const int64_t wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t1).count();
    g_stats.jobs.fetch_add(1, std::memory_order_relaxed);
    g_stats.chunks.fetch_add(n, std::memory_order_relaxed);
    g_stats.wait_ns.fetch_add(wait_ns, std::memory_order_relaxed);
    if (guard_.record(since_start_ns(), own_ns, own_chunks, wait_ns)) {
      g_stats.stalls.fetch_add(1, std::memory_order_relaxed);
      g_stats.stall_wait_ns.fetch_add(wait_ns, std::memory_order_relaxed);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  void barrier() {
    const uint32_t g = bar_gen_.load(std::memory_order_acquire);
    if (bar_count_.fetch_add(1, std::memory_order_acq_rel) + 1 == t_team) {
      bar_count_.store(0, std::memory_order_relaxed);
      bar_gen_.fetch_add(1, std::memory_order_release);
      bar_sig_.notify();
    } else {
      auto passed = [&] { return bar_gen_.load(std::memory_order_acquire) != g; };
      if (!spin_until(passed, join_spin_)) bar_sig_.wait(passed);
    }
  }

 private:
  static constexpr uint64_t kClosed = 0xffffffffu;  // claim_'s slot field of a closed job: above any n

  // The next free slot of job `seq`, or -1 when it has none left (or is no longer current).
  int64_t claim(uint64_t seq) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
      if ((c >> 32) != seq) return -1;
      const int64_t i = int64_t(c & 0xffffffffu);
      // n_ may belong to the next job by now: then the previous one was closed first (try_run),
      // and the exchange below fails on the closed word.
      if (i >= n_.load(std::memory_order_acquire)) return -1;
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) return i;
    }
  }

  void run_slot(int i, int n, bool team) {
    t_in_job = true;
    t_team = team ? n : 1;
    try {
      fn_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), i, n);
    } catch (...) {
      std::lock_guard<std::mutex> g(err_mu_);
      if (!error_) error_ = std::current_exception();
    }
    t_in_job = false;
    t_team = 1;
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) done_sig_.notify();
  }

  void work(int me) {
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "llmk-pool");  // how tools (and the tests) find the workers
#endif
    if (placement_ == Placement::kBind) bind_to_nth_allowed(me, size());
    Nudger nudger(min_idle_);
    std::vector<int> taken;
    uint64_t seen = 0;
    for (;;) {
      auto fresh = [&] { return stop_.load(std::memory_order_relaxed) || (claim_.load(std::memory_order_acquire) >> 32) != seen; };
      if (!spin_until(fresh, idle_spin_)) job_sig_.wait(fresh);
      if (stop_.load()) return;
      seen = claim_.load(std::memory_order_acquire) >> 32;
      place(me, nudger, taken);
      // A claimed slot pins the job: the caller waits for it before the job's fields change.
      int64_t i = claim(seen);
      if (i < 0) continue;
      const bool team = team_.load(std::memory_order_relaxed);
      const int n = n_.load(std::memory_order_relaxed);
      int64_t ran = 1;
      run_slot(int(i), n, team);
      if (!team)
        for (; (i = claim(seen)) >= 0; ++ran) run_slot(int(i), n, false);
      g_stats.worker_chunks.fetch_add(ran, std::memory_order_relaxed);
    }
  }

  // Before worker `me` claims a chunk of a new job: notes the CPU it runs on, counts the jobs it
  // found itself on the caller's CPU, and (nudge mode) moves off a CPU that another pool thread
  // is on when a free one is allowed (thread_placement.h).
  void place(int me, Nudger& nudger, std::vector<int>& taken) {
    int cpu = current_cpu();
    const int caller = cpus_[0].load(std::memory_order_relaxed);
    g_stats.worker_jobs.fetch_add(1, std::memory_order_relaxed);
    if (cpu >= 0 && cpu == caller) g_stats.colocated.fetch_add(1, std::memory_order_relaxed);
    if (placement_ == Placement::kNudge) {
      taken.clear();
      for (int t = 0; t < size(); ++t)
        if (t != me) taken.push_back(cpus_[size_t(t)].load(std::memory_order_relaxed));
      // A worker late for a job may nudge after the caller has returned: the lock keeps the
      // nudge's mask save/restore from undoing a mask change (pause_thread_placement).
      std::unique_lock<std::mutex> hold(g_placement_mu, std::try_to_lock);
      if (hold.owns_lock() && nudger.maybe_move(since_start_ns(), cpu, taken.data(), int(taken.size()))) {
        g_stats.nudges.fetch_add(1, std::memory_order_relaxed);
        cpu = current_cpu();
      }
    }
    cpus_[size_t(me)].store(cpu, std::memory_order_relaxed);
  }

  const std::chrono::microseconds idle_spin_, join_spin_;
  StallGuard guard_;  // touched only while run_mu_ is held
  const Placement placement_;
  const double min_idle_;  // a nudge's target CPUs: idle at least this share of the time lately
  std::vector<std::atomic<int>> cpus_;  // the CPU each pool thread (0: the caller) was last seen on
  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one job at a time
  uint64_t seq_ = 0;
  std::atomic<uint64_t> claim_{0};  // current job's seq << 32 | its next free slot
  std::atomic<TeamFn> fn_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<int> n_{0};
  std::atomic<bool> team_{false};
  std::atomic<int> done_{0};  // slots finished
  std::atomic<bool> stop_{false};
  Signal job_sig_, done_sig_, bar_sig_;
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
  // OpenMP's fork/join waits for every team member at the end of each parallel region: when one
  // of them is preempted (another process on the cores), the kernel waits a scheduler quantum.
  // The pool does not, so it is the default; LLMKERN_THREADS=openmp asks for OpenMP.
  const char* mode = std::getenv("LLMKERN_THREADS");
  return mode && std::string(mode) == "openmp";
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
  new (&g_placement_mu) std::mutex();  // a worker of the parent's may have held it
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

void run_inline(TeamFn fn, void* ctx, int n) {
  const bool outer = t_in_job;
  const int outer_team = t_team;
  t_in_job = true;  // a team of one: barriers are no-ops, nested loops run inline
  t_team = 1;
  struct Restore {
    bool j;
    int n;
    ~Restore() { t_in_job = j, t_team = n; }
  } restore{outer, outer_team};
  for (int i = 0; i < n; ++i) fn(ctx, i, n);
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

int default_threads() {
  return env_int("OMP_NUM_THREADS", available_cpus());
}

int pool_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = default_threads();
    g_threads.store(n);
  }
  return n;
}

void set_pool_threads(int n) {
  std::lock_guard<std::mutex> g(g_mu);
  n = std::max(1, n);
  g_threads.store(n);
#if defined(_OPENMP)
  if (use_openmp()) omp_set_num_threads(n);
#endif
  if (g_pool && g_pool->size() != n) {
    delete g_pool;  // joins its workers; the next job starts a pool of the new size
    g_pool = nullptr;
  }
}

void pool_for(int nchunks, int nthreads, TeamFn fn, void* ctx) {
  if (nchunks <= 0) return;
  if (nthreads > 1 && nchunks > 1 && !t_in_job && pool().try_run(nchunks, false, fn, ctx)) return;
  run_inline(fn, ctx, nchunks);
}

void pool_run(int nthreads, TeamFn fn, void* ctx) {
  if (nthreads > 1 && !t_in_job && pool().try_run(nthreads, true, fn, ctx)) return;
  run_inline(fn, ctx, 1);
}

void pool_barrier() {
  if (t_team > 1) g_pool->barrier();
}

bool pool_in_job() { return t_in_job; }

void wait_until_equal(const std::atomic<uint8_t>& flag, uint8_t value) {
  static const std::chrono::microseconds spin(env_int("LLMKERN_JOIN_SPIN_US", 50, 0));
  const auto set = [&] { return flag.load(std::memory_order_acquire) == value; };
  while (!spin_until(set, spin)) sched_yield();
}

void pause_thread_placement(bool pause) {
  if (pause)
    g_placement_mu.lock();
  else
    g_placement_mu.unlock();
}

const char* pool_placement() {
  switch (placement_from_env()) {
    case Placement::kOff: return "off";
    case Placement::kBind: return "bind";
    default: return "nudge";
  }
}

long long pool_selftest(int jobs, int max_chunks) {
  LLMK_CHECK(jobs >= 0, ValueError, "jobs: expected >= 0, got ", jobs);
  LLMK_CHECK(max_chunks >= 1 && max_chunks <= 4096, ValueError, "max_chunks: expected 1..4096, got ", max_chunks);
  struct Job {
    std::vector<std::atomic<int>> ran;
    std::atomic<int> team_errors{0};
  };
  std::vector<Job> all(static_cast<size_t>(jobs));
  long long bad = 0;
  for (int j = 0; j < jobs; ++j) {
    Job& job = all[size_t(j)];
    // Counts that alternate low and high: a late worker's view of the previous, smaller job is
    // the case a hand-off must get right.
    const int n = j % 2 ? max_chunks - (j / 2) % std::max(1, max_chunks / 2) : 1 + (j / 2) % max_chunks;
    job.ran = std::vector<std::atomic<int>>(size_t(n));
    if (j % 16 == 15) {  // a team: each member passes two barriers and sees all others' marks between them
      job.ran = std::vector<std::atomic<int>>(size_t(pool_threads()));
      pool_run(pool_threads(), [](void* p, int t, int count) {
        Job& jb = *static_cast<Job*>(p);
        jb.ran[size_t(t)].fetch_add(1);
        pool_barrier();
        for (int u = 0; u < count; ++u)
          if (jb.ran[size_t(u)].load() != 1) jb.team_errors.fetch_add(1);
        pool_barrier();
      }, &job);
      bad += job.team_errors.load() + (job.ran[0].load() != 1);  // member 0 is the caller, always
      continue;
    }
    pool_for(n, pool_threads(), [](void* p, int i, int) { static_cast<Job*>(p)->ran[size_t(i)].fetch_add(1); }, &job);
    for (auto& r : job.ran) bad += r.load() != 1;  // not run before the join returned, or twice
  }
  for (Job& job : all)  // a late, stale run of a finished job's chunk shows here
    for (auto& r : job.ran) bad += r.load() > 1;
  return bad;
}

PoolStats pool_stats() {
  auto us = [](const std::atomic<int64_t>& ns) { return ns.load(std::memory_order_relaxed) / 1000; };
  return {g_stats.jobs.load(std::memory_order_relaxed), g_stats.chunks.load(std::memory_order_relaxed),
          g_stats.worker_chunks.load(std::memory_order_relaxed), g_stats.solo_jobs.load(std::memory_order_relaxed),
          g_stats.stalls.load(std::memory_order_relaxed), us(g_stats.wait_ns), us(g_stats.stall_wait_ns),
          g_stats.worker_jobs.load(std::memory_order_relaxed), g_stats.colocated.load(std::memory_order_relaxed),
          g_stats.nudges.load(std::memory_order_relaxed)};
}

}  // namespace llmk
