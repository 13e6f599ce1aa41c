// The SIMT emulator's scheduler: runs the blocks of a launch one after another and the threads of
// a block as cooperative fibers. A fiber runs until it must wait (barrier, warp collective) or
// exits, then hands over directly to the next ready fiber in thread order; when none is ready and
// some are still waiting, the block is deadlocked (divergent barrier, partial collective) and the
// launch fails with a RuntimeError that says who waits where. Errors unwind every fiber's stack
// (a FiberAbort exception thrown at its wait point) before the launch reports them.
// The deadlock report (simt_runtime_deadlock.cpp) and the warp collectives' completion
// (simt_runtime_warp.cpp) live beside it, sharing simt_runtime_internal.h.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "simt/simt_emu.h"
#include "simt/simt_fiber.h"
#include "simt/simt_runtime.h"
#include "simt/simt_runtime_internal.h"
#include "simt/simt_sched.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace llmk {
namespace simt {
namespace emu {

namespace detail {

Emulator& emu() {
  static Emulator* e = new Emulator();  // never destroyed: fibers may outlive static teardown
  return *e;
}

}  // namespace detail

using namespace detail;

namespace {

thread_local bool tls_in_launch = false;

bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || (f1 && f2 && std::strcmp(f1, f2) == 0));
}

// ---- switching --------------------------------------------------------------------------------------

void fiber_main(void* p);

void enter(Context* from, Fiber* to) {
  Emulator& g = emu();
  g.cur = to;
  threadIdx = to->tid;
  ++g.stats.switches;
  if (!to->started) {
    to->started = true;
    context_start(&to->ctx, &to->stack, &fiber_main, to);
  }
  context_switch(from, &to->ctx);
}

void leave_to_main(Fiber* me) {
  Emulator& g = emu();
  g.cur = nullptr;
  ++g.stats.switches;
  context_switch(&me->ctx, &g.main);
}

Fiber* next_ready(int after) {
  Emulator& g = emu();
  for (int k = 1; k <= g.n; ++k) {
    Fiber* f = g.pool[(after + k) % g.n].get();
    if (f->state == kWaitCond && f->cond(f->cond_arg)) f->state = kReady;
    if (f->state == kReady) return f;
  }
  return nullptr;
}

// The current fiber (state already set to what it waits at) yields until that wait completes.
void wait_here(Fiber* me) {
  Emulator& g = emu();
  Fiber* nx = next_ready(me->linear);
  if (nx) enter(&me->ctx, nx);
  else leave_to_main(me);  // nobody can run: the launcher diagnoses the deadlock
  g.cur = me;
  threadIdx = me->tid;
  if (g.aborting) throw FiberAbort{};
}

void flush_cp(Fiber* f, long below_group) {
  size_t k = 0;
  for (; k < f->cp.size() && f->cp[k].group < below_group; ++k)
    std::memcpy(f->cp[k].dst, f->cp[k].data, 16);
  f->cp.erase(f->cp.begin(), f->cp.begin() + static_cast<std::ptrdiff_t>(k));
}


void fiber_main(void* p) {
  Fiber* me = static_cast<Fiber*>(p);
  Emulator& g = emu();
  bool ran = false;
  if (!g.aborting) {
    try {
      g.body(g.body_ctx);
      ran = true;
    } catch (const FiberAbort&) {
    } catch (const std::exception& e) {
      if (g.error.empty()) g.error = str_cat("thread ", me->linear, " threw: ", e.what());
    } catch (...) {
      if (g.error.empty()) g.error = str_cat("thread ", me->linear, " threw an unknown exception");
    }
  }
  // A thread's outstanding cp.async copies still land in shared memory after it exits.
  if (!g.aborting && g.error.empty()) flush_cp(me, 1L << 62);
  if (ran && g.error.empty()) {
    std::string err = hopper_thread_exit(me->linear);
    if (!err.empty()) {
      g.error = str_cat("thread ", me->linear, ": ", err);
      ran = false;
    }
  }
  me->state = kDone;
  --g.live;
  g.warp_exited[static_cast<size_t>(me->warp)] |= 1u << me->lane;
  if (ran && g.error.empty()) {
    try {
      complete_after_exit(me);  // collectives that waited only for lanes that have now exited
    } catch (const FiberAbort&) {
    }
  }
  for (;;) {  // a finished fiber is never resumed
    Fiber* nx = (g.aborting || !g.error.empty()) ? nullptr : next_ready(me->linear);
    if (nx) enter(&me->ctx, nx);
    else leave_to_main(me);
  }
}

Fiber* current(const char* what) {
  Fiber* f = emu().cur;
  if (!f) throw RuntimeError(str_cat(what, ": called outside a kernel launched with LLMK_LAUNCH"));
  return f;
}

void run_block() {
  Emulator& g = emu();
  for (int i = 0; i < g.n; ++i) {
    Fiber* f = g.pool[i].get();
    f->state = kReady;
    f->started = false;
    f->cp.clear();
    f->cp_group = 0;
  }
  for (WarpGroup& grp : g.groups) grp.used = false;
  std::fill(g.warp_exited.begin(), g.warp_exited.end(), 0u);
  g.bar_arrived = 0;
  g.live = g.n;
  ++g.stats.blocks;
  hopper_block_begin(g.n);
  enter(&g.main, g.pool[0].get());
  // Back here when no fiber can run: all done, deadlocked, or failed.
  if (g.error.empty() && g.live > 0) g.error = describe_deadlock();
  if (g.error.empty()) g.error = hopper_block_end();
  if (g.error.empty()) return;
  g.aborting = true;
  for (int i = 0; i < g.n; ++i) {
    Fiber* f = g.pool[i].get();
    if (f->state == kDone) continue;
    if (!f->started) {
      f->state = kDone;
      continue;
    }
    enter(&g.main, f);  // it throws FiberAbort at its wait point, unwinds and comes back
  }
  g.aborting = false;
}

size_t stack_bytes() {
  size_t kb = 128;
  if (const char* s = std::getenv("LLMKERN_SIMT_STACK_KB")) kb = std::max<long>(16, std::atol(s));
  return kb * 1024;
}

}  // namespace

// ---- entry points used by simt_emu.h ---------------------------------------------------------------

void fail(const char* what) {
  Emulator& g = emu();
  Fiber* f = g.cur;
  if (!f) throw RuntimeError(what);
  if (g.error.empty())
    g.error = str_cat("thread (", f->tid.x, ",", f->tid.y, ",", f->tid.z, "): ", what);
  throw FiberAbort{};
}

int barrier(int op, int pred, const char* file, int line) {
  Emulator& g = emu();
  Fiber* me = current(bar_name(op));
  if (g.bar_arrived == 0) {
    g.bar_op = op;
    g.bar_file = file;
    g.bar_line = line;
    g.bar_count = 0;
    g.bar_and = 1;
    g.bar_or = 0;
  } else if (op != g.bar_op || !same_site(file, line, g.bar_file, g.bar_line)) {
    std::vector<int> waiting;
    for (int i = 0; i < g.n; ++i)
      if (g.pool[i]->state == kAtBarrier) waiting.push_back(i);
    fail(str_cat("divergent barrier: thread ", me->linear, " reached ", bar_name(op), "() at ", site(file, line),
                 " while threads ", ranges(waiting), " wait at ", bar_name(g.bar_op), "() at ",
                 site(g.bar_file, g.bar_line), " (every thread of a block must reach the same barrier)")
             .c_str());
  }
  g.bar_count += pred;
  g.bar_and &= pred;
  g.bar_or |= pred;
  ++g.stats.barriers;
  if (++g.bar_arrived == g.n) {
    const int r = op == kBarCount ? g.bar_count : op == kBarAnd ? g.bar_and : g.bar_or;
    for (int i = 0; i < g.n; ++i) {
      Fiber* f = g.pool[i].get();
      if (f->state == kAtBarrier) {
        f->state = kReady;
        f->out = static_cast<uint64_t>(r);
      }
    }
    g.bar_arrived = 0;
    return r;
  }
  me->state = kAtBarrier;
  me->file = file;
  me->line = line;
  wait_here(me);
  return static_cast<int>(me->out);
}

uint64_t warp_op(int op, unsigned mask, uint64_t value, int arg, const void* in, void* out, const char* file,
                 int line) {
  Emulator& g = emu();
  Fiber* me = current(op_name(op));
  const unsigned bit = 1u << me->lane;
  if (!(mask & bit))
    fail(str_cat(op_name(op), " at ", site(file, line), ": the calling lane ", me->lane, " is not in mask ",
                 hex(mask))
             .c_str());
  const unsigned exist = g.warp_lanes[me->warp];
  if ((op == kLdmatrix || op == kMma) && exist != 0xffffffffu)
    fail(str_cat(op_name(op), " at ", site(file, line), ": needs a full warp, but warp ", me->warp, " has only lanes ",
                 lanes_str(exist))
             .c_str());
  const unsigned eff = mask & exist;  // lanes beyond a partial last warp do not exist
  me->op = op;
  me->mask = mask;
  me->in = value;
  me->arg = arg;
  me->pin = in;
  me->pout = out;
  me->file = file;
  me->line = line;
  ++g.stats.collectives;
  WarpGroup* groups = &g.groups[static_cast<size_t>(me->warp) * 32];
  int k = 0, free_k = -1;
  for (; k < 32; ++k) {
    if (groups[k].used && groups[k].mask == eff) break;
    if (!groups[k].used && free_k < 0) free_k = k;
  }
  if (k == 32) {
    k = free_k;
    groups[k].used = true;
    groups[k].op = op;
    groups[k].mask = eff;
    groups[k].arrived = 0;
    groups[k].file = file;
    groups[k].line = line;
  } else if (groups[k].op != op) {
    fail(str_cat("mismatched warp collective: lane ", me->lane, " of warp ", me->warp, " called ", op_name(op),
                 "(mask=", hex(mask), ") at ", site(file, line), " while lanes ", lanes_str(groups[k].arrived),
                 " wait in ", op_name(groups[k].op), " at ", site(groups[k].file, groups[k].line))
             .c_str());
  }
  WarpGroup& grp = groups[k];
  grp.arrived |= bit;
  if (grp.arrived == (grp.mask & ~g.warp_exited[static_cast<size_t>(me->warp)])) {
    const WarpGroup done = grp;
    grp.used = false;
    complete(me->warp, done);
    return me->out;
  }
  me->state = kInWarpOp;
  me->group = k;
  wait_here(me);
  return me->out;
}

unsigned active_mask() {
  Emulator& g = emu();
  Fiber* me = current("__activemask");
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) {
    const int i = me->warp * 32 + l;
    if (i < g.n && g.pool[i]->state != kDone) m |= 1u << l;
  }
  return m;
}

void block_until(bool (*cond)(void*), void* arg, const char* what, const char* file, int line) {
  Fiber* me = current(what);
  if (cond(arg)) return;
  me->state = kWaitCond;
  me->cond = cond;
  me->cond_arg = arg;
  me->wait_what = what;
  me->file = file;
  me->line = line;
  wait_here(me);
}

int thread_linear() { return current("thread index")->linear; }
int block_size() { return emu().n; }
unsigned char* smem_base() { return emu().smem; }
size_t smem_size() { return emu().smem_size; }
std::string site_str(const char* file, int line) { return site(file, line); }

int lane() { return current("lane_id")->lane; }
int warp() { return current("warp_id")->warp; }

void* dynamic_smem() {
  current("LLMK_DYNAMIC_SMEM");
  return emu().smem;
}

void cp_async(void* dst, const void* src, int src_bytes, const char* file, int line) {
  Fiber* me = current("cp_async_16");
  if (src_bytes < 0 || src_bytes > 16)
    fail(str_cat("cp_async_16 at ", site(file, line), ": src_bytes must be in [0, 16], got ", src_bytes).c_str());
  if ((reinterpret_cast<uintptr_t>(dst) & 15u) || (src_bytes > 0 && (reinterpret_cast<uintptr_t>(src) & 15u)))
    fail(str_cat("cp_async_16 at ", site(file, line), ": shared and global addresses must be 16-byte aligned")
             .c_str());
  CpCopy c;
  c.dst = dst;
  c.group = me->cp_group;
  std::memset(c.data, 0, 16);
  if (src_bytes > 0) std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  me->cp.push_back(c);  // lands in shared memory when its group is waited for
}

void cp_async_commit() { ++current("cp_async_commit")->cp_group; }

void cp_async_wait(int pending) {
  Fiber* me = current("cp_async_wait");
  flush_cp(me, me->cp_group - pending);
}

void set_max_dynamic_smem(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > kMaxDynamicSmem)
    throw RuntimeError(str_cat("set_max_dynamic_smem: bytes must be in [0, ", kMaxDynamicSmem, "], got ", bytes));
  Emulator& g = emu();
  std::lock_guard<std::mutex> lock(g.mu);
  g.max_smem[kernel] = bytes;
}

void run_grid(const LaunchSpec& spec, void (*body)(void*), void* ctx) {
  const dim3 gr = spec.grid, bl = spec.block;
  const unsigned long long threads = 1ull * bl.x * bl.y * bl.z;
  const std::string where = str_cat("LLMK_LAUNCH(", spec.name, ")");
  LLMK_CHECK(!tls_in_launch, RuntimeError, where, ": launched from inside a kernel (no dynamic parallelism)");
  LLMK_CHECK(gr.x >= 1 && gr.y >= 1 && gr.z >= 1 && gr.x <= 0x7fffffffu && gr.y <= 65535 && gr.z <= 65535,
             RuntimeError, where, ": invalid grid (", gr.x, ",", gr.y, ",", gr.z,
             "): each dim >= 1, x < 2^31, y and z <= 65535");
  LLMK_CHECK(threads >= 1 && threads <= 1024 && bl.x <= 1024 && bl.y <= 1024 && bl.z <= 64, RuntimeError, where,
             ": invalid block (", bl.x, ",", bl.y, ",", bl.z, "): 1 to 1024 threads, z <= 64");
  Emulator& g = emu();
  std::lock_guard<std::mutex> lock(g.mu);
  if (spec.smem > kDefaultDynamicSmem) {
    auto it = g.max_smem.find(spec.kernel);
    LLMK_CHECK(it != g.max_smem.end() && static_cast<size_t>(it->second) >= spec.smem, RuntimeError, where, ": ",
               spec.smem, " bytes of dynamic shared memory exceed the default 48 KiB; call "
               "llmk::simt::set_max_dynamic_smem(kernel, bytes) first");
  }
  if (g.stack_bytes == 0) g.stack_bytes = stack_bytes();
  const int n = static_cast<int>(threads);
  while (static_cast<int>(g.pool.size()) < n) {
    auto f = std::make_unique<Fiber>();
    f->stack.allocate(g.stack_bytes);
    g.pool.push_back(std::move(f));
  }
  g.n = n;
  g.nwarps = (n + 31) / 32;
  g.warp_lanes.assign(static_cast<size_t>(g.nwarps), 0xffffffffu);
  g.warp_exited.assign(static_cast<size_t>(g.nwarps), 0u);
  if (n % 32) g.warp_lanes.back() = (1u << (n % 32)) - 1;
  g.groups.assign(static_cast<size_t>(g.nwarps) * 32, WarpGroup());
  for (int i = 0; i < n; ++i) {
    Fiber* f = g.pool[i].get();
    f->linear = i;
    f->lane = i % 32;
    f->warp = i / 32;
    f->tid = {static_cast<unsigned>(i) % bl.x, static_cast<unsigned>(i) / bl.x % bl.y,
              static_cast<unsigned>(i) / (bl.x * bl.y)};
  }
  // 1024-byte aligned: the Hopper swizzle patterns repeat every 1024 bytes of address.
  const size_t smem_alloc = (std::max<size_t>(spec.smem, 16) + 1023) / 1024 * 1024;
  if (smem_alloc > g.smem_cap) {
    std::free(g.smem);
    g.smem = static_cast<unsigned char*>(std::aligned_alloc(1024, smem_alloc));
    if (!g.smem) {
      g.smem_cap = 0;
      throw RuntimeError(str_cat(where, ": cannot allocate ", smem_alloc, " bytes of shared memory"));
    }
    g.smem_cap = smem_alloc;
  }
  std::memset(g.smem, 0xff, smem_alloc);  // uninitialised shared memory reads as NaN / -1, not 0
  g.smem_size = spec.smem;
  g.spec = &spec;
  g.body = body;
  g.body_ctx = ctx;
  g.error.clear();
  g.aborting = false;
  blockDim = bl;
  gridDim = gr;
  ++g.stats.launches;
  tls_in_launch = true;
  for (unsigned z = 0; z < gr.z; ++z)
    for (unsigned y = 0; y < gr.y; ++y)
      for (unsigned x = 0; x < gr.x; ++x) {
        blockIdx = {x, y, z};
        run_block();
        if (!g.error.empty()) {
          tls_in_launch = false;
          g.cur = nullptr;
          throw RuntimeError(str_cat("simt: kernel ", spec.name, ", block (", x, ",", y, ",", z, "): ", g.error));
        }
      }
  tls_in_launch = false;
  g.cur = nullptr;
}

Stats stats() {
  Emulator& g = emu();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.stats;
}

}  // namespace emu
}  // namespace simt
}  // namespace llmk