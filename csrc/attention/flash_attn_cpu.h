// Internal interface between the CPU attention scheduler (flash_attn_cpu.cpp) and its two tile
// kernels (flash_attn_gemm_cpu.cpp, flash_attn_tiles_cpu.cpp): a task is a block of query rows of
// one sequence that share one kv head, attending to one key range (a split). The kernel leaves the
// un-normalised fp32 output and the softmax state of every row in the thread's scratch; the
// scheduler writes them.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "attention/attention_math.h"
#include "attention/attn_vec_cpu.h"
#include "common/kv_quant.h"

LLMK_NS_BEGIN
namespace attn {

struct Task {
  int b;        // sequence
  int kvh, nh;  // kv heads kvh .. kvh+nh-1; the rows are their query heads kvh*G .. (kvh+nh)*G-1
  bool small;   // decode kernel (few rows per kv head) or GEMM kernel (nh = 1)
  int i0, nq;   // query rows i0 .. i0+nq-1 of the sequence
  int split;    // split index (0 when not split)
  int nsplit;   // splits of this sequence's keys (1: not split; the output is written directly)
  int k0, k1;   // key range of the split
  int sq, sk;   // sequence lengths
  double cost;  // for scheduling (largest first)
};

// Grow-only 64-byte aligned float buffer (one set per thread).
struct Buf {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t need) {
    if (need > n) {
      free(p);
      n = (need + 1023) & ~size_t(1023);
      p = static_cast<float*>(aligned_alloc(64, n * sizeof(float)));
    }
    return p;
  }
  ~Buf() { free(p); }
};

// The AMX kernel's K and V^T of a call's (sequence, kv head) pairs, packed once for all the
// tasks that read them (flash_attn_amx_cpu.cpp): per pair, blocks of 32 keys from key 0, each K
// [32][D] then V^T [D][32] in bf16 (keys past the sequence zero). at[b * Hkv + kvh] is the pair's
// first block in elements of base, -1 for a pair left to its task.
struct PackedKv {
  const uint16_t* base = nullptr;
  std::vector<int64_t> at;
};

// Per-thread results and scratch. Rows are ordered r = g * nq + (i - i0) with g = the query head
// minus kvh*G (head-major); o has row stride dp (head_dim rounded up to the vector width).
struct Scratch {
  Buf o, m, l, q, s, k, v, t, aux;
  Buf ot;  // the AMX kernel's transposed output
  int dp = 0;
  const PackedKv* kv = nullptr;  // the call's packed K / V^T, if any (AMX kernel)
};

Scratch& thread_scratch();

// Sequences with G * sq < kSmallRows go to the decode kernel (dot products over a few rows per kv
// head; one task covers all kv heads so that whole cache blocks stream in order), longer ones to
// the GEMM kernel (register-blocked Q.K^T and P.V over tiles, one kv head per task).
constexpr int kSmallRows = 16;

void attend_gemm(const AttnParams& p, const Task& t, Scratch& sc);
// attend_gemm on AMX tiles (flash_attn_amx_cpu.cpp) when the AMX level runs, the inputs are bf16
// (no quantised KV) and head_dim is a multiple of 32 up to 256; returns false, doing nothing, otherwise.
bool attend_gemm_amx(const AttnParams& p, const Task& t, Scratch& sc);
// Whether attend_gemm_amx takes this call's GEMM tasks.
bool amx_attention(const AttnParams& p);
// Packs K and V^T once (in parallel) for every (sequence, kv head) that `tasks_per_pair`
// [b * Hkv + kvh] says two or more GEMM tasks read; returns an empty PackedKv (at empty) when
// none does or the packed copy would exceed its memory bound. The memory is the calling thread's
// and stays valid until its next call.
PackedKv pack_kv_amx(const AttnParams& p, const std::vector<int>& tasks_per_pair);
void attend_small(const AttnParams& p, const Task& t, Scratch& sc);
// The bf16 decode kernel of AVX-512 builds on AVX512_BF16 CPUs (flash_decode_cpu.cpp), head_dim a
// multiple of 32 up to 256; returns false, doing nothing, for anything else.
bool attend_decode(const AttnParams& p, const Task& t, Scratch& sc);

// AVX512_BF16 dot products (vdpbf16ps) for bf16 inputs: the CPU has them and
// LLMKERN_ATTN_BF16_DOT=0 does not turn them off. Always false outside the AVX-512 build.
bool cpu_bf16_dot();


// Per-row mask / bias data of a task. Rows r = g * nq + qi: query i = i0 + qi, head kvh*G + g.
struct Rows {
  float* lo;     // first visible key
  float* hi;     // one past the last visible key
  float* pos;    // i + sk - sq (ALiBi)
  float* slope;  // ALiBi slope of the row's head (0 without ALiBi)
  int klo, khi;            // union of the rows' key ranges within the task's split
  int full_lo, full_hi;    // keys in [full_lo, full_hi) are visible to every row
};

Rows make_rows(const AttnParams& p, const Task& t, int G, int Mp, float* aux);

// The GEMM kernels' online softmax over one key tile (flash_attn_gemm_cpu.cpp): scores S^T
// [nk][Mp] (rows in the lanes), times scale -> probabilities, with each row's running max m, sum l
// and output scale alpha.
void softmax_tile(float* S, int Mp, int nk, int j0, const Rows& R, bool full, float cap, bool alibi, float* m,
                  float* l, float* alpha, float scale);
#if defined(__AVX512F__)
// softmax_tile that writes the probabilities as bf16 key pairs Pp [np][Mp] (zero past nk; rounded
// by vcvtneps2bf16 when cvt, the same bits) instead of back into S: the AMX kernel's P^T operand.
void softmax_tile_pairs(float* S, int Mp, int nk, int j0, const Rows& R, bool full, float cap, bool alibi,
                        float* m, float* l, float* alpha, float scale, uint32_t* Pp, int np, bool cvt);
#endif
// The task's M bf16 query rows as d pairs, Qp [head_dim / 2][Mp] (one 32-bit word per row; lanes
// past M zero): the B operand of the bf16 kernels' K . Q^T.
void pack_q_pairs(const AttnParams& p, const Task& t, int G, int M, int Mp, uint32_t* Qp);

template <DType T>
using E = typename Elem<T>::type;

template <DType T>
LLMK_ALWAYS_INLINE const E<T>* q_row(const AttnParams& p, int b, int i, int h) {
  return static_cast<const E<T>*>(p.q) + int64_t(attn_q_start(p, b) + i) * p.q_row_stride +
         int64_t(h) * p.q_head_stride;
}

// Query row of a task's row r = g * nq + qi (head-major, as Scratch orders them): query i0 + qi of
// head kvh * G + g.
template <DType T>
LLMK_ALWAYS_INLINE const E<T>* task_q_row(const AttnParams& p, const Task& t, int G, int r) {
  return q_row<T>(p, t.b, t.i0 + r % t.nq, t.kvh * G + r / t.nq);
}

template <DType T>
LLMK_ALWAYS_INLINE const E<T>* kv_row(const AttnParams& p, bool is_v, int b, int j, int h) {
  return static_cast<const E<T>*>(is_v ? p.v : p.k) + attn_kv_offset(p, is_v, b, j, h);
}

// Row pointers (kv head kvh) of keys j0 .. j0+n-1: one block-table read per cache block.
template <DType T>
void tile_rows(const AttnParams& p, int b, int kvh, int j0, int n, const E<T>** kr, const E<T>** vr) {
  if (!p.block_table) {
    for (int jj = 0; jj < n; ++jj) {
      kr[jj] = kv_row<T>(p, false, b, j0 + jj, kvh);
      vr[jj] = kv_row<T>(p, true, b, j0 + jj, kvh);
    }
    return;
  }
  const int32_t* bt = p.block_table + int64_t(b) * p.block_table_stride;
  const E<T>* K = static_cast<const E<T>*>(p.k) + int64_t(kvh) * p.k_head_stride;
  const E<T>* V = static_cast<const E<T>*>(p.v) + int64_t(kvh) * p.v_head_stride;
  int blk = j0 / p.block_size, slot = j0 % p.block_size;
  for (int jj = 0; jj < n;) {
    const int64_t id = bt[blk];
    const E<T>* kb = K + id * p.k_block_stride;
    const E<T>* vb = V + id * p.v_block_stride;
    for (; slot < p.block_size && jj < n; ++slot, ++jj) {
      kr[jj] = kb + int64_t(slot) * p.k_row_stride;
      vr[jj] = vb + int64_t(slot) * p.v_row_stride;
    }
    slot = 0;
    ++blk;
  }
}

// dst[0..dp) = src[0..d) * scale, zero padded (dp = d rounded up to VL).
template <DType T>
LLMK_ALWAYS_INLINE void row_to_f32(const E<T>* src, int d, float scale, float* dst) {
  int c = 0;
  for (; c + VL <= d; c += VL) storeu(dst + c, load<T>(src + c) * scale);
  if (c < d) storeu(dst + c, load_tail<T>(src + c, d - c) * scale);
}

// fp8 codes (MBits mantissa bits, exponent bias Bias) to fp32 values x scale, VL at a time, in
// integer steps that never form an fp32 subnormal (slow on x86): the exponent is rebased by
// adding (127 - Bias) << 23; a subnormal code (exponent 0) is read with exponent 1 and 2^(1 - Bias)
// subtracted, which is exact. Every finite code decodes exactly (the cache writes saturate, so
// e4m3's NaN and e5m2's inf / NaN codes are never stored).
template <int MBits, int Bias>
LLMK_ALWAYS_INLINE vf fp8_to_f32(vu b) {
  const vu e = (b >> MBits) & (0x7fu >> MBits);
  const vu sub = (vu)(e == 0);  // all ones where subnormal
  const vu u = ((b & 0x7fu) << (23 - MBits)) + ((127u - Bias) << 23) + (sub & (1u << 23));
  const vf min_normal = splat(1.f / float(1 << (Bias - 1)));
  vf f = (vf)u - (vf)(sub & (vu)min_normal);
  return (vf)((vu)f | ((b & 0x80u) << 24));
}

// VL bytes widened to 32-bit lanes (GCC's generic conversion of byte vectors goes through
// scalar moves).
LLMK_ALWAYS_INLINE vu load_u8(const uint8_t* p) {
#if defined(__AVX512F__)
  return (vu)_mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  return (vu)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  vu r;
  for (int i = 0; i < VL; ++i) r[i] = p[i];
  return r;
#endif
}

template <int MBits, int Bias>
LLMK_ALWAYS_INLINE void fp8_row_to_f32(const uint8_t* src, int d, float scale, KvQuant q, float* dst) {
  int c = 0;
  for (; c + VL <= d; c += VL) storeu(dst + c, fp8_to_f32<MBits, Bias>(load_u8(src + c)) * scale);
  for (; c < d; ++c) dst[c] = kvq::decode(src[c], q) * scale;
}

// Row j of kv head h as fp32 in dst[0..dp), zero padded: converted from the attention dtype, or
// dequantised (code value * the head's scale) from a quantised cache.
template <DType T>
LLMK_ALWAYS_INLINE void kv_row_to_f32(const AttnParams& p, bool is_v, int b, int j, int h, float* dst) {
  const int d = p.head_dim;
  if (p.kv_quant == KvQuant::None) return row_to_f32<T>(kv_row<T>(p, is_v, b, j, h), d, 1.f, dst);
  const uint8_t* src = static_cast<const uint8_t*>(is_v ? p.v : p.k) + attn_kv_offset(p, is_v, b, j, h);
  const float scale = is_v ? p.v_scale[p.v_scale_stride * h] : p.k_scale[p.k_scale_stride * h];
  if (p.kv_quant == KvQuant::E4M3) {
    fp8_row_to_f32<3, 7>(src, d, scale, p.kv_quant, dst);
  } else if (p.kv_quant == KvQuant::E5M2) {
    fp8_row_to_f32<2, 15>(src, d, scale, p.kv_quant, dst);
  } else {
    const int8_t* s8 = reinterpret_cast<const int8_t*>(src);
    for (int c = 0; c < d; ++c) dst[c] = float(s8[c]) * scale;
  }
  for (int c = d; c % VL; ++c) dst[c] = 0.f;
}

}  // namespace attn
LLMK_NS_END
