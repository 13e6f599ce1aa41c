// The threads of the CPU kernels: llmkern's own pool (one per process), or OpenMP's on request.
//
// A decode step calls ~250 short kernels back to back, with Python in between, and the cores are
// often shared (a second engine, an HTTP server, a build). The pool therefore:
// - cuts each kernel into a few chunks per thread that every thread, the caller included, claims
//   from one counter, so a worker that is not running costs no waiting: the others take its
//   chunks (OpenMP's fork/join waits for every member, a scheduler quantum when one is preempted);
// - lets idle workers spin for LLMKERN_SPIN_US (default 300 us, enough to bridge the Python
//   between two kernels) and then sleep on a futex, but stop spinning at once when sched_yield()
//   shows another thread wants the core; joins and team barriers spin at most
//   LLMKERN_JOIN_SPIN_US (default 50 us) before they sleep.
// - shrinks to the caller alone for a while (a few times the wait) after a join that waited far
//   longer than a chunk takes (a worker was descheduled mid-chunk), then retries (stall_guard.h;
//   LLMKERN_ADAPTIVE_THREADS=0 turns this off). The chunks are the same either way, so results are too.
// - moves a worker that finds itself on the caller's CPU (or another worker's) to an allowed CPU
//   that is idle (LLMKERN_PLACEMENT_IDLE), briefly, then gives it its full mask back
//   (thread_placement.h; LLMKERN_THREAD_PLACEMENT=off turns this off, =bind pins each worker to
//   one CPU instead).
// LLMKERN_THREADS=openmp runs the parallel loops on OpenMP (the runtime torch loads) instead. A
// forked child always uses the pool (libgomp's threads do not survive a fork).
#pragma once
#include <atomic>
#include <cstdint>

namespace llmk {

using TeamFn = void (*)(void* ctx, int index, int count);

// Threads a kernel may use, the caller included: set_num_threads(), else OMP_NUM_THREADS, else the
// CPUs this process may run on (affinity mask, capped by the cgroup CPU quota).
int pool_threads();
void set_pool_threads(int n);
int default_threads();

// fn(ctx, i, nchunks) once for every chunk i in [0, nchunks), spread over the pool's threads and
// the caller (a thread takes the next free chunk when it is done with one); returns when all are
// done, rethrowing the first exception. Inline when nthreads <= 1, inside a job, or while another
// thread's job holds the pool.
void pool_for(int nchunks, int nthreads, TeamFn fn, void* ctx);

// A team: fn(ctx, t, n) for every t in [0, n) at once, each on its own thread, the caller running
// t = 0, with n = min(nthreads, pool size); members may meet at pool_barrier(). From inside a job,
// or while another thread's job holds the pool, it runs fn(ctx, 0, 1) on the caller.
void pool_run(int nthreads, TeamFn fn, void* ctx);

// Inside a team job: all of the team's threads wait for each other.
void pool_barrier();

// True inside a pool job (nested parallel loops run inline).
bool pool_in_job();

// Returns once `flag` holds `value`, which another thread of the same parallel loop stores when
// it finishes a piece of work it has claimed (and so is running). Spins as the pool's joins do
// (LLMKERN_JOIN_SPIN_US), offering the core whenever another thread wants it, then keeps yielding
// it: the setter may be waiting for this very core.
void wait_until_equal(const std::atomic<uint8_t>& flag, uint8_t value);

// LLMKERN_THREAD_PLACEMENT as the pool reads it: "nudge", "bind" or "off".
const char* pool_placement();

// pause: no worker moves itself until the same thread calls it with false (taken around a change
// of the threads' affinity masks, which a nudge's save/restore of its own mask would undo).
void pause_thread_placement(bool pause);

// Counters since the process started (the pool's jobs only; OpenMP's regions are not counted):
// jobs run on the pool's threads, their chunks (team members count as chunks) and how many of
// those the workers ran (the rest: the caller), jobs the caller ran alone after a stall, stalls (joins that
// waited far longer than a chunk takes), the microseconds joins waited in all and in stalls, how
// many times a worker joined a job, how many of those it was on the caller's CPU (the two took
// turns on one core), and how many times a worker moved off such a CPU (thread_placement.h).
struct PoolStats {
  long long jobs, chunks, worker_chunks, solo_jobs, stalls, wait_us, stall_wait_us;
  long long worker_jobs, colocated, nudges;
};
PoolStats pool_stats();

// The pool's hand-off protocol under stress: `jobs` jobs back to back with chunk counts that rise
// and fall (1..max_chunks), each chunk bumping its own counter, plus a team job with barriers every
// 16th job. Returns how many chunks ran more or less than once, or had not run when their job
// returned. Every job's counters stay alive to the end, so a late worker that runs a chunk of a
// finished job is counted, not a crash. 0 is the only right answer.
long long pool_selftest(int jobs, int max_chunks);

// True when the kernels' parallel loops should use OpenMP rather than the pool (decided once).
bool use_openmp();

}  // namespace llmk
