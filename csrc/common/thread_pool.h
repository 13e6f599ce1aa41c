// The threads of the CPU kernels: OpenMP's, or llmkern's own pool (one per process).
//
// A decode step calls ~150 short kernels back to back, with Python in between, so a pool must be
// awake when the next kernel comes. OpenMP's threads (the same runtime as torch's: the process
// loads one libgomp) spin for milliseconds after each region by default, which suits that, and
// sharing them with torch means a torch op and an llmkern kernel never fight over the cores. Under
// OMP_WAIT_POLICY=PASSIVE (common on shared machines) they sleep after every region instead, and
// each kernel pays a futex wake-up: measured at 25-35% of a batched decode step. Then (or with
// LLMKERN_THREADS=pool, or without OpenMP) the kernels run on llmkern's own pool, whose workers
// spin for LLMKERN_SPIN_US (default 300 us: long enough to bridge the Python between two kernels),
// yielding the core as they do, then sleep. LLMKERN_THREADS=openmp forces OpenMP. A forked child
// always uses the own pool (libgomp's threads do not survive a fork).
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

// True when the kernels' parallel loops should use OpenMP rather than the pool (decided once).
bool use_openmp();

}  // namespace llmk
