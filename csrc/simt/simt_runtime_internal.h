// Internal to the SIMT scheduler (simt_runtime*.cpp): the emulator's state (fibers, pending warp
// collectives, the block's barrier), the message helpers its errors are built with, and the functions
// one of its files calls in another (deadlock report, warp-collective completion).
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "simt/simt_emu.h"
#include "simt/simt_fiber.h"
#include "simt/simt_runtime.h"

namespace llmk {
namespace simt {
namespace emu {

namespace detail {

struct FiberAbort {};  // unwinds a fiber after the launch failed; caught in fiber_main only

struct CpCopy {
  void* dst;
  long group;
  unsigned char data[16];
};

enum State : uint8_t { kReady, kAtBarrier, kInWarpOp, kWaitCond, kDone };

struct Fiber {
  Context ctx;
  FiberStack stack;
  uint3 tid;
  int linear = 0, lane = 0, warp = 0;
  State state = kReady;
  bool started = false;
  // What it waits at (for diagnostics) and the operands of its warp collective.
  int op = 0, group = -1, arg = 0;
  unsigned mask = 0;
  const char* file = nullptr;
  int line = 0;
  uint64_t in = 0, out = 0;
  const void* pin = nullptr;
  void* pout = nullptr;
  // kWaitCond: runnable again once cond(cond_arg) holds (mbarriers, named barriers, warpgroups)
  bool (*cond)(void*) = nullptr;
  void* cond_arg = nullptr;
  const char* wait_what = nullptr;
  std::vector<CpCopy> cp;  // issued cp.async copies, in issue (= group) order
  long cp_group = 0;       // index of the group still open for new copies
};

struct WarpGroup {  // one pending collective of one warp: lanes of `mask` meet here
  bool used = false;
  int op = 0;
  unsigned mask = 0, arrived = 0;
  const char* file = nullptr;
  int line = 0;
};

struct Emulator {
  std::mutex mu;
  const LaunchSpec* spec = nullptr;
  void (*body)(void*) = nullptr;
  void* body_ctx = nullptr;
  std::vector<std::unique_ptr<Fiber>> pool;
  int n = 0, nwarps = 0;
  std::vector<unsigned> warp_lanes;  // lanes that exist in each warp (last warp may be partial)
  std::vector<unsigned> warp_exited;  // lanes that have exited, per warp
  std::vector<WarpGroup> groups;     // nwarps * 32
  Fiber* cur = nullptr;
  Context main;
  int live = 0;
  bool aborting = false;
  std::string error;
  // __syncthreads state
  int bar_arrived = 0, bar_op = 0, bar_count = 0, bar_and = 1, bar_or = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  // dynamic shared memory
  unsigned char* smem = nullptr;
  size_t smem_cap = 0, smem_size = 0;
  std::unordered_map<const void*, int> max_smem;
  Stats stats;
  size_t stack_bytes = 0;
};

// One per process (simt_runtime.cpp).
Emulator& emu();

inline const char* short_path(const char* file) {
  if (!file) return "?";
  const char* best = nullptr;
  for (const char* p = file; (p = std::strstr(p, "csrc/")) != nullptr; ++p) best = p + 5;
  if (best) return best;
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

inline std::string site(const char* file, int line) { return str_cat(short_path(file), ":", line); }

inline const char* op_name(int op) {
  switch (op) {
    case kShflIdx: return "__shfl_sync";
    case kShflUp: return "__shfl_up_sync";
    case kShflDown: return "__shfl_down_sync";
    case kShflXor: return "__shfl_xor_sync";
    case kBallot: return "__ballot_sync";
    case kAny: return "__any_sync";
    case kAll: return "__all_sync";
    case kSyncWarp: return "__syncwarp";
    case kLdmatrix: return "ldmatrix";
    case kMma: return "mma_m16n8k16";
    default: return "warp collective";
  }
}

inline const char* bar_name(int op) {
  switch (op) {
    case kBarCount: return "__syncthreads_count";
    case kBarAnd: return "__syncthreads_and";
    case kBarOr: return "__syncthreads_or";
    default: return "__syncthreads";
  }
}

// "0-15, 17, 20-31"
inline std::string ranges(const std::vector<int>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ", ";
    s += j == i ? str_cat(ids[i]) : str_cat(ids[i], "-", ids[j]);
    i = j + 1;
  }
  return s;
}

inline std::string lanes_str(unsigned mask) {
  std::vector<int> ids;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) ids.push_back(l);
  return ranges(ids);
}

inline std::string hex(unsigned v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += digits[(v >> (4 * i)) & 15u];
  return s;
}

// simt_runtime_deadlock.cpp: why no thread of the block can run (the launch's error message).
std::string describe_deadlock();

// simt_runtime_warp.cpp: finish a collective all lanes of its mask have reached (or exited from).
void complete(int w, const WarpGroup& grp);
void complete_after_exit(Fiber* me);

}  // namespace detail
}  // namespace emu
}  // namespace simt
}  // namespace llmk
