// Internal interface between the CPU attention scheduler (flash_attn_cpu.cpp) and its two tile
// kernels (flash_attn_tiles_cpu.cpp): a task is a block of query rows of one sequence that share
// one kv head, attending to one key range (a split). The kernel leaves the un-normalised fp32
// output and the softmax state of every row in the thread's scratch; the scheduler writes them.
#pragma once
#include <stdint.h>
#include <stdlib.h>

#include "attention/attention_math.h"

LLMK_NS_BEGIN
namespace attn {

struct Task {
  int b;        // sequence
  int kvh, nh;  // kv heads kvh .. kvh+nh-1; the rows are their query heads kvh*G .. (kvh+nh)*G-1
  bool small;   // decode kernel (few rows per kv head) or GEMM kernel (nh = 1)
  int i0, nq;   // query rows i0 .. i0+nq-1 of the sequence
  int split;    // split index (0 when not split)
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

// Per-thread results and scratch. Rows are ordered r = g * nq + (i - i0) with g = the query head
// minus kvh*G (head-major); o has row stride dp (head_dim rounded up to the vector width).
struct Scratch {
  Buf o, m, l, q, s, k, v, t, aux;
  int dp = 0;
};

Scratch& thread_scratch();

// Sequences with G * sq < kSmallRows go to the decode kernel (dot products over a few rows per kv
// head; one task covers all kv heads so that whole cache blocks stream in order), longer ones to
// the GEMM kernel (register-blocked Q.K^T and P.V over tiles, one kv head per task).
constexpr int kSmallRows = 16;

void attend_gemm(const AttnParams& p, const Task& t, Scratch& sc);
void attend_small(const AttnParams& p, const Task& t, Scratch& sc);

}  // namespace attn
LLMK_NS_END
