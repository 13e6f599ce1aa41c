// llmkern's own CPU thread pool (one per process, shared by every CPU kernel).
//
// Why not OpenMP: a decode step calls ~150 short kernels back to back, with Python in between. A
// pool that puts its threads to sleep after each kernel (OMP_WAIT_POLICY=PASSIVE, common on shared
// machines) pays a futex wake-up per call, measured at 25-35% of a batched decode step here; one
// that spins at every barrier for milliseconds (OpenMP's default) fights other work for the cores.
// These workers spin for a bounded time after each job (LLMKERN_SPIN_US, default 300 us: long
// enough to bridge the Python between two kernels), yielding the core as they do, then sleep.
// The pool does not depend on the OpenMP runtime, nor on its environment variables.
#pragma once

namespace llmk {

using TeamFn = void (*)(void* ctx, int tid, int nthreads);

// Threads a kernel may use, the caller included: set_num_threads(), else OMP_NUM_THREADS, else the
// CPUs this process may run on.
int pool_threads();
void set_pool_threads(int n);

// fn(ctx, t, n) for every t in [0, n) at once, the caller running t = 0, with n = min(nthreads,
// pool size); returns when all are done, rethrowing the first exception any of them threw. From
// inside a job, or while another thread's job holds the pool, it runs fn(ctx, 0, 1) on the caller.
void pool_run(int nthreads, TeamFn fn, void* ctx);

// Inside a job: all of the job's threads wait for each other.
void pool_barrier();

// True inside a pool job (nested parallel loops run inline).
bool pool_in_job();

}  // namespace llmk
