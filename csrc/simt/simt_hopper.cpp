// Emulation of the Hopper layer (simt_hopper_emu.h): mbarriers, TMA tensor loads, wgmma and
// named barriers, on top of the fiber scheduler (simt_runtime.cpp) through simt_sched.h.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "simt/simt_emu.h"
#include "simt/simt_hopper_emu.h"
#include "simt/simt_sched.h"

namespace llmk {
namespace simt {

bool make_tensor_map(TensorMap* map, const void* base, int elem_bytes, int rank, const uint64_t* dims,
                     const uint64_t* strides_bytes, const uint32_t* box, int swizzle_bytes) {
  // The driver's rules (cuTensorMapEncodeTiled) that the emulation relies on.
  if (!map || rank < 1 || rank > 5 || !(elem_bytes == 1 || elem_bytes == 2 || elem_bytes == 4)) return false;
  if (reinterpret_cast<uintptr_t>(base) & 15u) return false;
  if (!(swizzle_bytes == 0 || swizzle_bytes == 32 || swizzle_bytes == 64 || swizzle_bytes == 128)) return false;
  TensorMap m;
  m.base = base;
  m.rank = rank;
  m.elem_bytes = elem_bytes;
  m.swizzle = swizzle_bytes;
  m.strides[0] = uint64_t(elem_bytes);
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 1 || dims[i] > (uint64_t(1) << 32) || box[i] < 1 || box[i] > 256) return false;
    m.dims[i] = dims[i];
    m.box[i] = box[i];
    if (i > 0) {
      if (strides_bytes[i - 1] % 16 || strides_bytes[i - 1] >= (uint64_t(1) << 40)) return false;
      m.strides[i] = strides_bytes[i - 1];
    }
  }
  const uint32_t inner = box[0] * uint32_t(elem_bytes);
  if (inner % 16) return false;
  if (swizzle_bytes && inner != uint32_t(swizzle_bytes)) return false;  // one swizzle row per box row
  *map = m;
  return true;
}

namespace emu {

namespace {

struct Mbar {
  int count = 0, pending = 0, phase = 0;
  long tx = 0;
};

struct TmaOp {
  uint32_t bar;
  uint32_t dst;
  std::vector<unsigned char> image;  // the box as it lands (swizzled)
  const char* file;
  int line;
};

struct Pending {  // a wgmma result not yet waited for
  float* d;
  std::vector<float> vals;
  long group;
  const char* file;
  int line;
};

struct ThreadState {
  std::vector<Pending> wg;
  long group = 0;  // index of the wgmma group still open
};

struct WarpgroupRv {  // a wgmma the 128 threads of a warpgroup meet at
  int arrived = 0;
  long generation = 0;
  const char* file = nullptr;
  int line = 0;
  std::vector<WgmmaArgs> args;
};

struct NamedBar {
  int expected = 0, arrived = 0;
  long generation = 0;
  const char* file = nullptr;
  int line = 0;
};

struct State {
  int threads = -1;
  bool dirty = true;  // some Hopper operation ran since the last reset
  std::unordered_map<uint32_t, Mbar> bars;
  std::vector<TmaOp> tma;
  std::vector<ThreadState> th;
  std::vector<WarpgroupRv> wgs;
  NamedBar named[16];
};

State& st() {
  static State* s = new State();
  return *s;
}

// The state of the running block, marked for a reset at the next block (most kernels never touch it).
State& used() {
  State& s = st();
  s.dirty = true;
  return s;
}

[[noreturn]] void failf(const std::string& msg) { fail(msg.c_str()); }

Mbar& bar_at(void* bar, const char* what, const char* file, int line) {
  const uint32_t off = smem_offset(bar, what, file, line);
  if (off & 7u) failf(str_cat(what, " at ", site_str(file, line), ": the mbarrier is not 8-byte aligned"));
  auto it = st().bars.find(off);
  if (it == st().bars.end())
    failf(str_cat(what, " at ", site_str(file, line), ": mbarrier at shared offset ", off,
                  " was never initialised (mbar_init)"));
  return it->second;
}

void settle(Mbar& m) {  // a phase completes when arrivals and transactions are both done
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1;
    m.pending = m.count;
  }
}

// TMA copies into barrier `off` land now (at a test of / wait on the barrier).
void land(uint32_t off) {
  State& s = st();
  unsigned char* smem = smem_base();
  size_t k = 0;
  for (size_t i = 0; i < s.tma.size(); ++i) {
    TmaOp& op = s.tma[i];
    if (op.bar != off) {
      if (k != i) s.tma[k] = std::move(op);
      ++k;
      continue;
    }
    std::memcpy(smem + op.dst, op.image.data(), op.image.size());
    Mbar& m = s.bars[off];
    m.tx -= long(op.image.size());
    settle(m);
  }
  s.tma.resize(k);
}

uint32_t swizzle(uint32_t a, int bytes) {
  const uint32_t mask = bytes == 128 ? 7u : bytes == 64 ? 3u : bytes == 32 ? 1u : 0u;
  return a ^ (((a >> 7) & mask) << 4);
}

struct WaitBar {
  uint32_t off;
  int parity;
};
bool bar_passed(void* p) {
  const WaitBar* w = static_cast<const WaitBar*>(p);
  land(w->off);
  return st().bars[w->off].phase != w->parity;
}

struct WaitGen {
  const long* gen;
  long seen;
};
bool gen_moved(void* p) {
  const WaitGen* w = static_cast<const WaitGen*>(p);
  return *w->gen != w->seen;
}

// ---- wgmma ------------------------------------------------------------------------------------

struct Desc {
  uint32_t start, lbo, sbo;
  int swz;
};

Desc decode(uint64_t d, const char* what, const char* file, int line) {
  Desc r;
  r.start = uint32_t(d & 0x3fff) << 4;
  r.lbo = uint32_t((d >> 16) & 0x3fff) << 4;
  r.sbo = uint32_t((d >> 32) & 0x3fff) << 4;
  const int mode = int(d >> 62);
  r.swz = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;
  if ((d >> 49) & 7)
    failf(str_cat("wgmma at ", site_str(file, line), ": ", what, " descriptor has a base offset; the emulation "
                  "supports only swizzle atoms aligned to their repeat (base offset 0)"));
  return r;
}

// Byte offset of element (r, k) of a 16-bit operand, r the M/N index, k in [0, 16). K-major: k is
// contiguous; MN-major: r is (PTX ISA canonical layouts, in 16-byte units T = 8 elements).
uint32_t operand_addr(const Desc& d, int r, int k, bool k_major) {
  uint32_t a;
  if (k_major) {
    if (d.swz == 0) a = d.start + (r / 8) * d.sbo + (r % 8) * 16 + (k / 8) * d.lbo + (k % 8) * 2;
    else a = d.start + (r / 8) * d.sbo + (r % 8) * d.swz + k * 2;
  } else {
    if (d.swz == 0) a = d.start + (r % 8) * 2 + (r / 8) * d.sbo + (k % 8) * 16 + (k / 8) * d.lbo;
    else {
      const int w = d.swz / 2;  // elements per swizzle row
      a = d.start + (r % w) * 2 + (r / w) * d.lbo + (k % 8) * d.swz + (k / 8) * d.sbo;
    }
  }
  return d.swz ? swizzle(a, d.swz) : a;
}

float input(uint16_t bits, bool fp16) { return fp16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits); }

float read_operand(const Desc& d, int r, int k, bool k_major, bool fp16, const char* file, int line) {
  const uint32_t a = operand_addr(d, r, k, k_major);
  if (size_t(a) + 2 > smem_size())
    failf(str_cat("wgmma at ", site_str(file, line), ": operand element (", r, ", ", k, ") at shared offset ", a,
                  " is outside the ", smem_size(), " bytes of dynamic shared memory"));
  uint16_t bits;
  std::memcpy(&bits, smem_base() + a, 2);
  return input(bits, fp16);
}

void complete_wgmma(int wg, WarpgroupRv& rv) {
  State& s = st();
  const WgmmaArgs& w0 = rv.args[0];
  const int N = w0.n;
  const bool rs = w0.a != nullptr;
  for (int t = 1; t < 128; ++t) {
    const WgmmaArgs& w = rv.args[t];
    if (w.n != N || w.trans_b != w0.trans_b || w.fp16 != w0.fp16 || (w.a != nullptr) != rs ||
        w.desc_b != w0.desc_b || (!rs && w.desc_a != w0.desc_a) || w.scale_d != w0.scale_d)
      failf(str_cat("wgmma at ", site_str(rv.file, rv.line), ": thread ", wg * 128 + t,
                    " of the warpgroup passed a different shape, type, descriptor or scale-d than thread ",
                    wg * 128, " (they must be warpgroup-uniform)"));
  }
  std::vector<float> A(64 * 16), B(16 * size_t(N)), D(64 * size_t(N), 0.f);
  if (rs) {
    for (int t = 0; t < 128; ++t) {
      const int wp = t / 32, l = t % 32, g = l >> 2, q = l & 3;
      for (int i = 0; i < 8; ++i) {
        const uint16_t bits = uint16_t(rv.args[t].a[i >> 1] >> (16 * (i & 1)));
        A[(16 * wp + g + 8 * ((i >> 1) & 1)) * 16 + 2 * q + (i & 1) + 8 * (i >> 2)] = input(bits, w0.fp16);
      }
    }
  } else {
    const Desc da = decode(w0.desc_a, "A", rv.file, rv.line);
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < 16; ++k) A[m * 16 + k] = read_operand(da, m, k, true, w0.fp16, rv.file, rv.line);
  }
  const Desc db = decode(w0.desc_b, "B", rv.file, rv.line);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < N; ++n) B[k * N + n] = read_operand(db, n, k, w0.trans_b == 0, w0.fp16, rv.file, rv.line);
  // C: each thread's accumulator fragment, or its pending (chained) value for the same registers.
  for (int t = 0; t < 128; ++t) {
    ThreadState& ts = s.th[size_t(wg * 128 + t)];
    const float* c = rv.args[t].d;
    for (const Pending& p : ts.wg)
      if (p.d == rv.args[t].d) c = p.vals.data();
    if (!w0.scale_d) continue;
    const int wp = t / 32, l = t % 32, g = l >> 2, q = l & 3;
    for (int i = 0; i < N / 8; ++i)
      for (int e = 0; e < 4; ++e) D[(16 * wp + g + 8 * (e >> 1)) * N + 8 * i + 2 * q + (e & 1)] = c[4 * i + e];
  }
  // Products of 16-bit inputs are exact; the sum is accumulated in double and rounded once.
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = D[m * N + n];
      for (int k = 0; k < 16; ++k) acc += double(A[m * 16 + k]) * B[k * N + n];
      D[m * N + n] = float(acc);
    }
  for (int t = 0; t < 128; ++t) {
    ThreadState& ts = s.th[size_t(wg * 128 + t)];
    float* d = rv.args[t].d;
    for (size_t i = 0; i < ts.wg.size(); ++i)
      if (ts.wg[i].d == d) {
        ts.wg.erase(ts.wg.begin() + long(i));
        break;
      }
    Pending p{d, std::vector<float>(size_t(N / 2)), ts.group, rv.file, rv.line};
    const int wp = t / 32, l = t % 32, g = l >> 2, q = l & 3;
    for (int i = 0; i < N / 8; ++i)
      for (int e = 0; e < 4; ++e) p.vals[4 * i + e] = D[(16 * wp + g + 8 * (e >> 1)) * N + 8 * i + 2 * q + (e & 1)];
    for (int i = 0; i < N / 2; ++i) d[i] = std::numeric_limits<float>::quiet_NaN();  // not readable yet
    ts.wg.push_back(std::move(p));
  }
}

}  // namespace

// ---- hooks ------------------------------------------------------------------------------------

void hopper_block_begin(int threads) {
  State& s = st();
  if (!s.dirty && s.threads == threads) return;
  s.dirty = false;
  s.threads = threads;
  s.bars.clear();
  s.tma.clear();
  s.th.assign(size_t(threads), ThreadState());
  s.wgs.assign(size_t((threads + 127) / 128), WarpgroupRv());
  for (NamedBar& b : s.named) b = NamedBar();
}

std::string hopper_thread_exit(int thread) {
  const ThreadState& ts = st().th[size_t(thread)];
  if (ts.wg.empty()) return "";
  const Pending& p = ts.wg.front();
  return str_cat("exited with the result of the wgmma at ", site_str(p.file, p.line),
                 " never waited for (missing wgmma_wait)");
}

std::string hopper_block_end() {
  const State& s = st();
  if (s.tma.empty()) return "";
  const TmaOp& op = s.tma.front();
  return str_cat("the TMA load at ", site_str(op.file, op.line), " (mbarrier at shared offset ", op.bar,
                 ") never landed: no thread tested or waited on its mbarrier");
}

// ---- entry points -----------------------------------------------------------------------------

uint32_t smem_offset(const void* p, const char* what, const char* file, int line) {
  const unsigned char* b = smem_base();
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (!b || c < b || c >= b + smem_size())
    failf(str_cat(what, " at ", site_str(file, line), ": the pointer is not in the launch's dynamic shared "
                  "memory (mbarriers, TMA destinations and wgmma operands must be)"));
  return uint32_t(c - b);
}

void mbar_init(void* bar, int count, const char* file, int line) {
  const uint32_t off = smem_offset(bar, "mbar_init", file, line);
  if (off & 7u) failf(str_cat("mbar_init at ", site_str(file, line), ": the mbarrier is not 8-byte aligned"));
  if (count < 1 || count > (1 << 20) - 1)
    failf(str_cat("mbar_init at ", site_str(file, line), ": count must be in [1, 2^20 - 1], got ", count));
  Mbar m;
  m.count = m.pending = count;
  used().bars[off] = m;
}

void mbar_arrive(void* bar, uint32_t expect_tx, const char* file, int line) {
  Mbar& m = bar_at(bar, expect_tx ? "mbar_arrive_expect_tx" : "mbar_arrive", file, line);
  m.tx += long(expect_tx);
  if (m.tx >= (1L << 20))
    failf(str_cat("mbar_arrive_expect_tx at ", site_str(file, line), ": transaction count ", m.tx,
                  " exceeds 2^20 - 1"));
  --m.pending;
  settle(m);
}

bool mbar_try_wait(void* bar, int parity, bool block, const char* file, int line) {
  bar_at(bar, block ? "mbar_wait" : "mbar_try_wait", file, line);
  WaitBar w{smem_offset(bar, "mbar_wait", file, line), parity & 1};
  if (bar_passed(&w)) return true;
  if (!block) return false;
  block_until(&bar_passed, &w, "mbar_wait", file, line);
  return true;
}

void tma_load(void* dst, const TensorMap* map, void* bar, int rank, const int* coords, const char* file, int line) {
  const uint32_t off_dst = smem_offset(dst, "tma_load", file, line);
  const uint32_t off_bar = smem_offset(bar, "tma_load", file, line);
  bar_at(bar, "tma_load", file, line);
  if (!map || map->rank != rank)
    failf(str_cat("tma_load at ", site_str(file, line), ": a ", rank, "-d load through a tensor map of rank ",
                  map ? map->rank : 0));
  const uint32_t align = map->swizzle ? 1024u : 128u;
  if (off_dst % align)
    failf(str_cat("tma_load at ", site_str(file, line), ": destination must be ", align, "-byte aligned"));
  const size_t es = size_t(map->elem_bytes), row = map->box[0] * es;
  size_t rows = 1;
  for (int i = 1; i < rank; ++i) rows *= map->box[i];
  if (off_dst + rows * row > smem_size())
    failf(str_cat("tma_load at ", site_str(file, line), ": the box does not fit in dynamic shared memory"));
  TmaOp op{off_bar, off_dst, std::vector<unsigned char>(rows * row, 0), file, line};
  std::vector<unsigned char> lin(row);
  for (size_t r = 0; r < rows; ++r) {
    // Row r of the box: coordinates of dims 1.. from r (dim 1 fastest).
    int64_t offset = 0;
    bool inside = true;
    size_t rr = r;
    for (int i = 1; i < rank; ++i) {
      const int64_t c = int64_t(coords[i]) + int64_t(rr % map->box[i]);
      rr /= map->box[i];
      if (c < 0 || uint64_t(c) >= map->dims[i]) inside = false;
      offset += c * int64_t(map->strides[i]);
    }
    std::fill(lin.begin(), lin.end(), 0);
    if (inside)
      for (uint32_t e = 0; e < map->box[0]; ++e) {
        const int64_t c = int64_t(coords[0]) + e;
        if (c >= 0 && uint64_t(c) < map->dims[0])
          std::memcpy(&lin[e * es], static_cast<const char*>(map->base) + offset + c * int64_t(es), es);
      }
    for (size_t ch = 0; ch < row; ch += 16) {
      const uint32_t a = uint32_t(r * row + ch);
      std::memcpy(&op.image[map->swizzle ? swizzle(a, map->swizzle) : a], &lin[ch], 16);
    }
  }
  used().tma.push_back(std::move(op));
}

void wgmma_fence(const char*, int) {}

void wgmma(const WgmmaArgs& args, const char* file, int line) {
  State& s = used();
  const int t = thread_linear();
  if (s.threads % 128)
    failf(str_cat("wgmma at ", site_str(file, line), ": the block has ", s.threads,
                  " threads, not a whole number of warpgroups (128)"));
  WarpgroupRv& rv = s.wgs[size_t(t / 128)];
  if (rv.arrived == 0) {
    rv.file = file;
    rv.line = line;
    rv.args.assign(128, WgmmaArgs());
  }
  rv.args[size_t(t % 128)] = args;
  if (++rv.arrived == 128) {
    complete_wgmma(t / 128, rv);
    rv.arrived = 0;
    ++rv.generation;
    return;
  }
  WaitGen w{&rv.generation, rv.generation};
  block_until(&gen_moved, &w, "wgmma (warpgroup-wide)", file, line);
}

void wgmma_commit() { ++used().th[size_t(thread_linear())].group; }

void wgmma_wait(int pending, const char*, int) {
  ThreadState& ts = st().th[size_t(thread_linear())];
  size_t k = 0;
  for (size_t i = 0; i < ts.wg.size(); ++i) {
    Pending& p = ts.wg[i];
    if (p.group < ts.group - pending) {
      std::memcpy(p.d, p.vals.data(), p.vals.size() * sizeof(float));
    } else {
      if (k != i) ts.wg[k] = std::move(p);
      ++k;
    }
  }
  ts.wg.resize(k);
}

void named_bar(int id, int threads, bool sync, const char* file, int line) {
  State& s = used();
  const char* what = sync ? "named_bar_sync" : "named_bar_arrive";
  if (id < 1 || id > 15)
    failf(str_cat(what, " at ", site_str(file, line), ": barrier id must be in [1, 15] (0 is __syncthreads'), got ", id));
  if (threads < 32 || threads % 32 || threads > s.threads)
    failf(str_cat(what, " at ", site_str(file, line), ": thread count must be a multiple of 32 up to the block's ",
                  s.threads, ", got ", threads));
  NamedBar& b = s.named[id];
  if (b.arrived == 0) {
    b.expected = threads;
    b.file = file;
    b.line = line;
  } else if (b.expected != threads) {
    failf(str_cat(what, " at ", site_str(file, line), ": barrier ", id, " expects ", b.expected,
                  " threads (as at ", site_str(b.file, b.line), "), this call says ", threads));
  }
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  if (!sync) return;
  WaitGen w{&b.generation, b.generation};
  block_until(&gen_moved, &w, "named_bar_sync", file, line);
}

}  // namespace emu
}  // namespace simt
}  // namespace llmk
