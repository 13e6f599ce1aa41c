// When to stop using the pool's workers for a while: the policy behind thread_pool.cpp's
// adaptive thread count (LLMKERN_ADAPTIVE_THREADS, on by default).
//
// A worker that claimed a chunk and was then descheduled (another process wants its core) makes
// the caller wait for the rest of that chunk until the scheduler runs the worker again: a
// scheduler slice (~1-3 ms) for a kernel that takes ~20-50 us. A decode step runs ~250 kernels, so
// a few such stalls per step cost more than the second thread gains. The caller can tell: its own
// chunks took t, yet it waited far longer than one chunk's worth for the others. After such a
// stall it runs the next `solo` jobs alone (no worker can hold it up), then tries the workers
// again; a stall on that first try doubles the solo stretch (the cores are still contended),
// a run of clean jobs resets it. Only the thread that holds the pool calls it (no atomics).
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
  static constexpr int64_t kFirstSolo = 32, kMaxSolo = 4096, kCleanToReset = 512;

  explicit StallGuard(bool enabled) : enabled_(enabled) {}

  // True: run this job on the caller alone (counts it).
  bool solo_now() {
    if (solo_left_ <= 0) return false;
    --solo_left_;
    return true;
  }

  // After a pooled job: the caller ran `own_chunks` chunks in `own_ns`, then waited `wait_ns`
  // for the others. Returns true when it counted as a stall.
  bool record(int64_t own_ns, int own_chunks, int64_t wait_ns) {
    const int64_t per_chunk = own_ns / std::max(own_chunks, 1);
    const bool stall = wait_ns > std::max(kMinStallNs, kChunkFactor * per_chunk);
    if (!enabled_) return stall;
    if (stall) {
      solo_left_ = solo_len_;
      // A stall on the first pooled job after a solo stretch: still contended, back off longer.
      if (clean_ == 0 && probing_) solo_len_ = std::min(solo_len_ * 2, kMaxSolo);
      probing_ = true;
      clean_ = 0;
    } else if (++clean_ >= kCleanToReset) {
      solo_len_ = kFirstSolo;
      probing_ = false;
    }
    return stall;
  }

  int64_t solo_len() const { return solo_len_; }

 private:
  bool enabled_;
  int64_t solo_left_ = 0, solo_len_ = kFirstSolo, clean_ = 0;
  bool probing_ = false;
};

}  // namespace llmk
