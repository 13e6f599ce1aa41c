// The SIMT scheduler's warp collectives: once every lane of a collective's mask has arrived (or
// exited), compute what each lane gets: shuffles, votes, ldmatrix fragments, mma_m16n8k16 results.
#include <cstdint>
#include <cstring>

#include "simt/simt_runtime_internal.h"

namespace llmk {
namespace simt {
namespace emu {

using namespace detail;

namespace {

uint32_t shfl_source(int op, int lane, int arg) {
  const int b = arg & 31, width = arg >> 8;
  // PTX shfl.sync with c = ((32 - width) << 8) | (up ? 0 : 31)
  const int segmask = 32 - width, cval = op == kShflUp ? 0 : 31;
  const int max_lane = (lane & segmask) | (cval & ~segmask), min_lane = lane & segmask;
  int j = lane;
  bool ok = false;
  switch (op) {
    case kShflUp: j = lane - b; ok = j >= max_lane; break;
    case kShflDown: j = lane + b; ok = j <= max_lane; break;
    case kShflXor: j = lane ^ b; ok = j <= max_lane; break;
    default: j = min_lane | (b & ~segmask); ok = j <= max_lane; break;
  }
  return static_cast<uint32_t>(ok ? j : lane);
}

float mma_input(uint32_t reg, int half, bool fp16) {
  const uint16_t bits = static_cast<uint16_t>(reg >> (16 * half));
  return fp16 ? f16_bits_to_f32(bits) : bf16_bits_to_f32(bits);
}

void complete_ldmatrix(Fiber* const* lanes, int arg) {
  const int num = arg & 7;
  const bool trans = arg & 8;
  uint16_t m[4][8][8];
  for (int j = 0; j < num; ++j) {
    for (int r = 0; r < 8; ++r) {
      const Fiber* f = lanes[8 * j + r];
      if (reinterpret_cast<uintptr_t>(f->pin) & 15u)
        fail(str_cat("ldmatrix at ", site(f->file, f->line), ": lane ", 8 * j + r,
                     " row address is not 16-byte aligned").c_str());
      std::memcpy(m[j][r], f->pin, 16);
    }
  }
  for (int l = 0; l < 32; ++l) {
    uint32_t* regs = static_cast<uint32_t*>(lanes[l]->pout);
    const int g = l >> 2, t = l & 3;
    for (int j = 0; j < num; ++j) {
      const uint16_t e0 = trans ? m[j][2 * t][g] : m[j][g][2 * t];
      const uint16_t e1 = trans ? m[j][2 * t + 1][g] : m[j][g][2 * t + 1];
      regs[j] = static_cast<uint32_t>(e0) | (static_cast<uint32_t>(e1) << 16);
    }
  }
}

void complete_mma(Fiber* const* lanes, bool fp16) {
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < 32; ++l) {
    const MmaOperands* o = static_cast<const MmaOperands*>(lanes[l]->pin);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 8; ++i)
      a[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] = mma_input(o->a[i >> 1], i & 1, fp16);
    for (int i = 0; i < 4; ++i) b[2 * t + (i & 1) + 8 * (i >> 1)][g] = mma_input(o->b[i >> 1], i & 1, fp16);
    for (int i = 0; i < 4; ++i) c[g + 8 * (i >> 1)][2 * t + (i & 1)] = o->c[i];
  }
  // Products of 16-bit inputs are exact; the sum is accumulated in double and rounded once.
  float d[16][8];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      double s = c[r][n];
      for (int k = 0; k < 16; ++k) s += static_cast<double>(a[r][k]) * b[k][n];
      d[r][n] = static_cast<float>(s);
    }
  for (int l = 0; l < 32; ++l) {
    float* out = static_cast<float*>(lanes[l]->pout);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) out[i] = d[g + 8 * (i >> 1)][2 * t + (i & 1)];
  }
}

}  // namespace

namespace detail {

// Exited lanes named in a mask are not waited for (CUDA: "all non-exited threads named in mask
// must execute the same intrinsic"), but reading a value from one is undefined, hence an error.
void complete(int w, const WarpGroup& grp) {
  Emulator& g = emu();
  const unsigned exited = g.warp_exited[static_cast<size_t>(w)] & grp.mask;
  Fiber* lanes[32] = {};
  for (int l = 0; l < 32; ++l)
    if ((grp.mask & ~exited) >> l & 1u) lanes[l] = g.pool[static_cast<size_t>(w) * 32 + l].get();
  if ((grp.op == kLdmatrix || grp.op == kMma) && exited)
    fail(str_cat(op_name(grp.op), " at ", site(grp.file, grp.line), ": needs all 32 lanes of warp ", w,
                 ", but lanes ", lanes_str(exited), " have exited")
             .c_str());
  switch (grp.op) {
    case kShflIdx: case kShflUp: case kShflDown: case kShflXor: {
      for (int l = 0; l < 32; ++l) {
        if (!lanes[l]) continue;
        const int width = lanes[l]->arg >> 8;
        if (width < 1 || width > 32 || (width & (width - 1)))
          fail(str_cat(op_name(grp.op), " at ", site(grp.file, grp.line), ": width ", width,
                       " is not a power of two in [1, 32]").c_str());
      }
      uint64_t res[32];
      for (int l = 0; l < 32; ++l) {
        if (!lanes[l]) continue;
        const uint32_t j = shfl_source(grp.op, l, lanes[l]->arg);
        if (exited >> j & 1u)
          fail(str_cat(op_name(grp.op), " at ", site(grp.file, grp.line), ": lane ", l, " of warp ", w,
                       " reads lane ", j, ", which has exited (undefined value)")
                   .c_str());
        // Reading a lane outside the mask is undefined on the GPU; here it returns the own value.
        res[l] = lanes[j] ? lanes[j]->in : lanes[l]->in;
      }
      for (int l = 0; l < 32; ++l)
        if (lanes[l]) lanes[l]->out = res[l];
      break;
    }
    case kBallot: case kAny: case kAll: {
      unsigned bits = 0;
      for (int l = 0; l < 32; ++l)
        if (lanes[l] && lanes[l]->in) bits |= 1u << l;
      const uint64_t r = grp.op == kBallot ? bits : grp.op == kAny ? (bits != 0) : (bits == (grp.mask & ~exited));
      for (int l = 0; l < 32; ++l)
        if (lanes[l]) lanes[l]->out = r;
      break;
    }
    case kLdmatrix: case kMma: {
      for (int l = 0; l < 32; ++l)
        if (lanes[l]->arg != lanes[0]->arg)
          fail(str_cat(op_name(grp.op), " at ", site(grp.file, grp.line), ": lanes ran different variants (",
                       site(lanes[0]->file, lanes[0]->line), " vs ", site(lanes[l]->file, lanes[l]->line), ")")
                   .c_str());
      if (grp.op == kLdmatrix) complete_ldmatrix(lanes, lanes[0]->arg);
      else complete_mma(lanes, lanes[0]->arg == 1);
      break;
    }
    default: break;  // __syncwarp: meeting is all it does
  }
  for (int l = 0; l < 32; ++l)
    if (lanes[l] && lanes[l]->state == kInWarpOp) lanes[l]->state = kReady;
}

void complete_after_exit(Fiber* me) {
  Emulator& g = emu();
  const unsigned exited = g.warp_exited[static_cast<size_t>(me->warp)];
  WarpGroup* groups = &g.groups[static_cast<size_t>(me->warp) * 32];
  for (int k = 0; k < 32; ++k) {
    WarpGroup& grp = groups[k];
    if (grp.used && (grp.mask >> me->lane & 1u) && grp.arrived == (grp.mask & ~exited)) {
      const WarpGroup done = grp;
      grp.used = false;
      complete(me->warp, done);
    }
  }
}

}  // namespace detail

}  // namespace emu
}  // namespace simt
}  // namespace llmk
