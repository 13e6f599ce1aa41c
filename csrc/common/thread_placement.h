// Where the pool's workers run (LLMKERN_THREAD_PLACEMENT; see thread_pool.h).
//
// The scheduler sometimes leaves a worker on the caller's CPU while another allowed CPU idles:
// the two threads then take turns on one core (the worker gets a few % of the chunks and batch-1
// decode drops to the one-thread speed), often for the life of the process (half of the fresh
// processes of a busy 2-core VM; bench_placement.py measures it).
// Modes:
// - nudge (default): a worker that finds itself, at the start of a job, on the CPU of the caller
//   or of another pool thread moves to the allowed CPUs that none of them is on and that were
//   mostly idle lately (Nudger below), with a temporary affinity mask, which migrates it at once;
//   then it gets its full mask back, so the scheduler can still move it off a core that another
//   process wants. Rate-limited, backing off while it keeps landing back.
// - bind: worker k runs only on the k-th allowed CPU (the caller, which runs Python and starts
//   its threads, is left free), when there are at least as many allowed CPUs as pool threads.
//   A bound worker cannot leave a core that another process keeps busy, and the free caller
//   still lands on the worker's CPU at times (most jobs, in 2 of 8 fresh processes measured):
//   for comparison only.
// - off: the scheduler alone.
// The chunks of a job do not depend on the placement, so results are the same bits in every mode.
#pragma once
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

namespace llmk {

enum class Placement { kOff, kNudge, kBind };

inline Placement placement_from_env() {
  const char* s = std::getenv("LLMKERN_THREAD_PLACEMENT");
  const std::string v = s ? s : "";
  if (v == "off" || v == "0") return Placement::kOff;
  if (v == "bind") return Placement::kBind;
  return Placement::kNudge;
}

// The CPU the calling thread runs on now, or -1 where that is unknown.
inline int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

// Pins the calling thread to the `index`-th CPU of its current affinity mask (wrapping around);
// false when the mask has fewer than `need` CPUs (then nothing changes).
inline bool bind_to_nth_allowed(int index, int need) {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0 || CPU_COUNT(&set) < need) return false;
  int k = index % CPU_COUNT(&set);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set) && k-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      return sched_setaffinity(0, sizeof(one), &one) == 0;
    }
#else
  (void)index, (void)need;
#endif
  return false;
}

// Per CPU, the share of the time it was idle between two reads of /proc/stat (whose counters
// tick every 10 ms, hence spans of at least kSpanNs).
class IdleMeter {
 public:
  static constexpr int64_t kSpanNs = 100'000'000, kStaleNs = 2'000'000'000;

  // Reads /proc/stat if the last read is a span old; true when the shares cover a recent span.
  bool update(int64_t now_ns) {
    if (now_ns - read_ns_ >= kSpanNs) {
      std::vector<unsigned long long> idle, total;
      if (!read(idle, total)) return false;
      fresh_ = now_ns - read_ns_ <= kStaleNs && idle.size() == idle_.size();
      share_.assign(idle.size(), 0.0);
      for (size_t c = 0; fresh_ && c < idle.size(); ++c) {
        const double dt = double(total[c] - total_[c]);
        share_[c] = dt > 0 ? double(idle[c] - idle_[c]) / dt : 0.0;
      }
      idle_.swap(idle), total_.swap(total);
      read_ns_ = now_ns;
    }
    return fresh_;
  }
  double idle_share(int cpu) const { return cpu >= 0 && size_t(cpu) < share_.size() ? share_[size_t(cpu)] : 0.0; }

 private:
  static bool read(std::vector<unsigned long long>& idle, std::vector<unsigned long long>& total) {
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return false;
    char line[512];
    while (std::fgets(line, sizeof(line), f)) {
      int cpu;
      unsigned long long v[8] = {0};
      if (std::sscanf(line, "cpu%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1], &v[2], &v[3],
                      &v[4], &v[5], &v[6], &v[7]) < 5 || cpu < 0 || cpu >= CPU_SETSIZE)
        continue;  // the first line ("cpu  ...", all CPUs) does not parse as cpu%d
      if (size_t(cpu) >= idle.size()) idle.resize(size_t(cpu) + 1, 0), total.resize(size_t(cpu) + 1, 0);
      idle[size_t(cpu)] = v[3] + v[4];  // idle + iowait
      total[size_t(cpu)] = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    }
    std::fclose(f);
    return !idle.empty();
  }

  std::vector<unsigned long long> idle_, total_;
  std::vector<double> share_;
  int64_t read_ns_ = INT64_MIN / 2;
  bool fresh_ = false;
};

// One worker's nudges: call at the start of each job with the CPU it runs on and the CPUs the
// caller and the other pool threads were last seen on. Only the owning worker touches it.
// It moves only to CPUs that were idle at least `min_idle` of the last span (/proc/stat): a
// worker moved onto a core another process keeps busy is preempted mid-chunk and makes the
// caller wait (measured on a loaded 2-core VM: batch-1 decode 3-17% slower than leaving the
// worker where the scheduler put it, in every alternating pair). LLMKERN_PLACEMENT_IDLE sets
// min_idle (default 0.5; 0 moves without looking).
class Nudger {
 public:
  explicit Nudger(double min_idle) : min_idle_(min_idle) {}

  // Nudges are at least a gap apart (kMinGapNs to kMaxGapNs). A worker put back on a taken CPU
  // within 4 gaps of its last nudge (the other CPUs are busy: the scheduler has its reasons)
  // doubles the gap; a later return halves it. A worker that keeps being put back thus moves
  // about once a second at most, and one that stays away gets prompt nudges again.
  static constexpr int64_t kMinGapNs = 1'000'000, kMaxGapNs = 1'000'000'000;

  // True when it moved the thread (then it runs on a CPU outside `taken`, under its own mask).
  bool maybe_move(int64_t now_ns, int cpu, const int* taken, int ntaken) {
#if defined(__linux__)
    if (cpu < 0 || !std::count(taken, taken + ntaken, cpu)) return false;
    if (now_ns < next_ns_) return false;
    cpu_set_t full, away;
    if (sched_getaffinity(0, sizeof(full), &full) != 0) return false;
    std::memcpy(&away, &full, sizeof(full));
    for (int i = 0; i < ntaken; ++i)
      if (taken[i] >= 0 && taken[i] < CPU_SETSIZE) CPU_CLR(taken[i], &away);
    if (CPU_COUNT(&away) == 0) {  // no free CPU (more threads than CPUs): look again in a while
      next_ns_ = now_ns + kMinGapNs;
      return false;
    }
    if (min_idle_ > 0) {
      const bool known = meter_.update(now_ns);
      for (int c = 0; known && c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &away) && meter_.idle_share(c) < min_idle_) CPU_CLR(c, &away);
      if (!known || CPU_COUNT(&away) == 0) {  // no idle CPU (or no span measured yet): look again later
        next_ns_ = now_ns + IdleMeter::kSpanNs;
        return false;
      }
    }
    gap_ns_ = now_ns - last_ns_ < 4 * gap_ns_ ? std::min(gap_ns_ * 2, kMaxGapNs) : std::max(gap_ns_ / 2, kMinGapNs);
    last_ns_ = now_ns;
    next_ns_ = now_ns + gap_ns_;
    // Leaving the current CPU out of the mask migrates the thread before the call returns; the
    // full mask back keeps it where it landed but free to move again.
    if (sched_setaffinity(0, sizeof(away), &away) != 0) return false;
    sched_setaffinity(0, sizeof(full), &full);
    return true;
#else
    (void)now_ns, (void)cpu, (void)taken, (void)ntaken;
    return false;
#endif
  }

 private:
  double min_idle_;
  IdleMeter meter_;
  int64_t next_ns_ = 0, last_ns_ = INT64_MIN / 2, gap_ns_ = kMinGapNs;
};

}  // namespace llmk
