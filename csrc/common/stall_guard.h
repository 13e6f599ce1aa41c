// When to stop using the pool's workers for a while: the policy behind thread_pool.cpp's
// adaptive thread count (LLMKERN_ADAPTIVE_THREADS, on by default).
//
// A worker that claimed a chunk and was then descheduled (another process wants its core) makes
// the caller wait for the rest of that chunk until the scheduler runs the worker again: from a
// scheduler slice (~1-3 ms) on a quiet machine to tens of ms on a loaded one, for kernels of
// ~20-50 us. The caller can tell: it waited far longer than one of its own chunks took. After such
// a stall of w ns it runs every job alone for the next factor * w ns, and for at least a few jobs
// (no worker can hold it up), then tries the workers again. Going solo costs at most the second
// thread's speed-up over that stretch, so a one-off stall costs at most a few times itself; a
// stall on the first pooled job after a solo stretch (the cores are still contended) doubles the
// factor, a run of clean jobs resets it. Only the thread that holds the pool calls it.
#pragma once
#include <algorithm>
#include <cstdint>

namespace llmk {

class StallGuard {
 public:
  // A wait above max(kMinStallNs, kChunkFactor * the caller's mean chunk time) is a stall:
  // chunks are cut evenly, so a running worker finishes its last one within about a chunk.
  static constexpr int64_t kMinStallNs = 250'000;
  static constexpr int64_t kChunkFactor = 4;
  static constexpr int64_t kFirstFactor = 4, kMaxFactor = 64, kCleanToReset = 512;
  static constexpr int kMinSoloJobs = 8;  // a stretch covers at least this many jobs

  explicit StallGuard(bool enabled) : enabled_(enabled) {}

  // True: run the job starting at `now_ns` on the caller alone.
  bool solo_now(int64_t now_ns) {
    if (solo_jobs_left_ > 0) {
      --solo_jobs_left_;
      return true;
    }
    return now_ns < solo_until_;
  }

  // After a pooled job that ended at `now_ns`: the caller ran `own_chunks` chunks in `own_ns`,
  // then waited `wait_ns` for the others. Returns true when it counted as a stall.
  bool record(int64_t now_ns, int64_t own_ns, int own_chunks, int64_t wait_ns) {
    const int64_t per_chunk = own_ns / std::max(own_chunks, 1);
    const bool stall = wait_ns > std::max(kMinStallNs, kChunkFactor * per_chunk);
    if (!enabled_) return stall;
    if (stall) {
      // The first pooled job after a solo stretch stalled: still contended, stay away longer.
      if (clean_ == 0 && probing_) factor_ = std::min(factor_ * 2, kMaxFactor);
      solo_until_ = now_ns + factor_ * wait_ns;
      solo_jobs_left_ = kMinSoloJobs;
      probing_ = true;
      clean_ = 0;
    } else if (++clean_ >= kCleanToReset) {
      factor_ = kFirstFactor;
      probing_ = false;
    }
    return stall;
  }

  int64_t factor() const { return factor_; }

 private:
  bool enabled_;
  int64_t solo_until_ = 0, factor_ = kFirstFactor, clean_ = 0;
  int solo_jobs_left_ = 0;
  bool probing_ = false;
};

}  // namespace llmk
