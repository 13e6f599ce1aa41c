// CUDA kernels of the MoE family (also run on the SIMT emulator). fused_moe is four launches on the
// caller's stream, no host synchronisation (graph-capturable):
//   1. align: the (token, slot) pairs grouped by local expert, each group padded to kBlockM rows
//      (one block: per-expert counts in shared memory, then a warp per expert scatters its pairs in
//      token order with ballots, so the grouping is deterministic);
//   2. gate/up: a grouped GEMM over row tiles of kBlockM pairs of one expert; each CTA computes 32
//      intermediate columns of gate and of up together and writes silu(gate) * up;
//   3. down: the same grouped GEMM on those activations, each pair's [H] output in fp32;
//   4. sum: out[t] = sum_j topk_weights[t, j] * y[t * k + j] in token order.
// Tiles with no pairs (past num_tokens_post_pad) return at once: experts nobody picked cost one
// empty CTA per tile. fp16/bf16 multiply on tensor cores (mma.m16n8k16, ldmatrix fragments, fp32
// accumulators); fp32 runs the same tiles on FMA units. Tiles are staged with 16-byte cp.async when
// the rows allow it (K a multiple of 16 bytes, aligned rows), element by element otherwise.
#include <cstdint>

#include "common/elem_device.cuh"
#include "common/simt.h"
#include "moe/moe.h"
#include "moe/moe_math.h"
#include "moe/moe_workspace.h"

namespace llmk {
namespace gpu {

namespace {

using moe::kBlockM;
constexpr int kThreads = 128;          // GEMM CTA: 4 warps
constexpr int kBN = 64;                // weight rows per CTA tile (down: 64 columns; gate/up: 32 + 32)
constexpr int kBK = 32;                // k step staged in shared memory
constexpr int kLd = kBK + 8;           // padded smem row: 16-byte aligned rows, fewer bank conflicts
constexpr int kAlignThreads = 256;

template <typename T>
__global__ void topk_softmax_kernel(float* weights, int32_t* ids, const T* gating, int64_t stride, int T_, int E,
                                    int k, bool renormalize) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T_) return;
  const T* row = gating + t * stride;
  moe::softmax_topk([&](int i) { return ld(row[i]); }, E, k, renormalize, weights + int64_t(t) * k,
                    ids + int64_t(t) * k);
}

// Grouping of the pairs by local expert; see the file comment. Dynamic smem: counts[E], offs[E+1].
__global__ void align_kernel(const int32_t* ids, int numel, const int32_t* expert_map, int map_size, int E, int B,
                             int32_t* sorted, int n_sorted, int32_t* blocks, int n_blocks, int32_t* npad) {
  LLMK_DYNAMIC_SMEM(int, smem);
  int* counts = smem;
  int* offs = smem + E;
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = tid; i < numel; i += blockDim.x) {
    const int e = moe::local_expert(ids[i], expert_map, map_size, E);
    if (e >= 0) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    offs[0] = 0;
    for (int e = 0; e < E; ++e) offs[e + 1] = offs[e] + (counts[e] + B - 1) / B * B;
    *npad = offs[E];
  }
  for (int i = tid; i < n_sorted; i += blockDim.x) sorted[i] = numel;
  __syncthreads();
  const int used = offs[E];
  for (int b = tid; b < n_blocks; b += blockDim.x) {
    int e = -1;
    if (b * B < used) {  // the last expert whose group starts at or before this block
      int lo = 0, hi = E - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offs[mid] <= b * B) lo = mid;
        else hi = mid - 1;
      }
      e = lo;
    }
    blocks[b] = e;
  }
  const int lane = llmk::simt::lane_id(), warps = blockDim.x / 32;
  for (int e = llmk::simt::warp_id(); e < E; e += warps) {
    int pos = offs[e];
    for (int base = 0; base < numel; base += 32) {
      const int i = base + lane;
      const bool match = i < numel && moe::local_expert(ids[i], expert_map, map_size, E) == e;
      const unsigned ballot = __ballot_sync(0xffffffffu, match);
      if (match) sorted[pos + __popc(ballot & ((1u << lane) - 1u))] = i;
      pos += __popc(ballot);
    }
  }
}

template <typename T>
struct Mma;
template <>
struct Mma<__half> {
  LLMK_DEVICE static void run(float* d, const uint32_t* a, const uint32_t* b) { llmk::simt::mma_m16n8k16_f16(d, a, b, d); }
};
template <>
struct Mma<__nv_bfloat16> {
  LLMK_DEVICE static void run(float* d, const uint32_t* a, const uint32_t* b) { llmk::simt::mma_m16n8k16_bf16(d, a, b, d); }
};

struct GemmArgs {
  const void* a;        // gate/up: hidden_states [T, K] (row stride lda); down: activations [n_sorted, K]
  int64_t lda;
  const void* w;        // [E, rows, K] contiguous
  int64_t w_rows;       // rows per expert: 2I (gate/up) or H (down)
  int K, N;             // N: intermediate columns (gate/up) or H (down)
  const int32_t* sorted;
  const int32_t* blocks;
  const int32_t* npad;
  int numel, topk;
  void* c;              // gate/up: activations [n_sorted, I] (T); down: y [numel, H] fp32
  bool vec;             // A and W rows are whole 16-byte chunks at 16-byte addresses: cp.async tiles
};

// Whether the tiles of A (row stride lda) and W can be staged in 16-byte cp.async chunks.
inline bool vec_ok(const void* a, int64_t lda, const void* w, int K, size_t elem) {
  const int64_t v = int64_t(16 / elem);
  return K % v == 0 && lda % v == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

// One CTA: kBlockM grouped rows x kBN weight rows of one expert. Gate: weight rows
// [c0, c0+32) of gate and of up (c0 = 32 * blockIdx.y), epilogue silu(gate) * up; else rows
// [64 * blockIdx.y, +64) of w2.
template <typename T, bool Gate>
__global__ void grouped_gemm_kernel(GemmArgs p) {
  __shared__ __align__(16) T sA[kBlockM][kLd];
  __shared__ __align__(16) T sB[kBN][kLd];
  __shared__ float sC[kBlockM][kBN + 1];
  __shared__ int64_t sRow[kBlockM];
  const int bx = blockIdx.x, tid = threadIdx.x;
  if (bx * kBlockM >= *p.npad) return;  // tiles past the used groups: uniform per CTA
  const int e = p.blocks[bx];
  const int c0 = Gate ? blockIdx.y * (kBN / 2) : blockIdx.y * kBN;
  if (tid < kBlockM) {
    const int pos = bx * kBlockM + tid;
    const int pair = p.sorted[pos];
    sRow[tid] = Gate ? (pair < p.numel ? pair / p.topk : -1) : pos;
  }
  const T* a = static_cast<const T*>(p.a);
  const T* w = static_cast<const T*>(p.w) + int64_t(e) * p.w_rows * p.K;
  // The weight row behind tile row j, or -1 past the matrix.
  auto wrow = [&](int j) -> int64_t {
    if (Gate) {
      const int col = c0 + (j & (kBN / 2 - 1));
      return col < p.N ? (j < kBN / 2 ? col : p.N + col) : -1;
    }
    return c0 + j < p.N ? c0 + j : -1;
  };
  const int lane = tid & 31, warp = tid >> 5;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  __syncthreads();
  for (int k0 = 0; k0 < p.K; k0 += kBK) {
    if (p.vec) {  // 16-byte chunks, zero-filled past the rows and K (K is a whole number of chunks)
      constexpr int kVec = 16 / sizeof(T), kChunks = kBK / kVec;
      for (int idx = tid; idx < kBlockM * kChunks; idx += kThreads) {
        const int r = idx / kChunks, c = idx % kChunks * kVec;
        const int64_t row = sRow[r];
        const bool in = row >= 0 && k0 + c < p.K;
        llmk::simt::cp_async_16(&sA[r][c], in ? a + row * p.lda + k0 + c : a, in ? 16 : 0);
      }
      for (int idx = tid; idx < kBN * kChunks; idx += kThreads) {
        const int j = idx / kChunks, c = idx % kChunks * kVec;
        const int64_t row = wrow(j);
        const bool in = row >= 0 && k0 + c < p.K;
        llmk::simt::cp_async_16(&sB[j][c], in ? w + row * p.K + k0 + c : w, in ? 16 : 0);
      }
      llmk::simt::cp_async_commit();
      llmk::simt::cp_async_wait_all();
    } else {
      for (int idx = tid; idx < kBlockM * kBK; idx += kThreads) {
        const int r = idx / kBK, c = idx % kBK;
        const int64_t row = sRow[r];
        sA[r][c] = row >= 0 && k0 + c < p.K ? a[row * p.lda + k0 + c] : st<T>(0.f);
      }
      for (int idx = tid; idx < kBN * kBK; idx += kThreads) {
        const int j = idx / kBK, c = idx % kBK;
        const int64_t row = wrow(j);
        sB[j][c] = row >= 0 && k0 + c < p.K ? w[row * p.K + k0 + c] : st<T>(0.f);
      }
    }
    __syncthreads();
    if constexpr (sizeof(T) == 2) {
      // Warp w: tile columns [16w, 16w + 16) as two n8 tiles (fragment rows as in flash_prefill.cuh).
      const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_chk = lane >> 4;
      const int b_row = (lane & 7) + 8 * (lane >> 4), b_chk = (lane >> 3) & 1;
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        uint32_t af[4], bf[4];
        llmk::simt::ldmatrix_x4(af, &sA[a_row][(kk * 2 + a_chk) * 8]);
        llmk::simt::ldmatrix_x4(bf, &sB[warp * 16 + b_row][(kk * 2 + b_chk) * 8]);
        Mma<T>::run(acc, af, bf);
        Mma<T>::run(acc + 4, af, bf + 2);
      }
    } else {
      // fp32: thread (r, g) owns tile row r = tid % 16 and columns g + 8 i.
      const int r = tid % kBlockM, g = tid / kBlockM;
#pragma unroll 4
      for (int c = 0; c < kBK; ++c) {
        const float av = ld(sA[r][c]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += av * ld(sB[g + 8 * i][c]);
      }
    }
    __syncthreads();
  }
  if constexpr (sizeof(T) == 2) {
    const int g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int col = warp * 16 + nt * 8 + t2;
      sC[g][col] = acc[nt * 4 + 0];
      sC[g][col + 1] = acc[nt * 4 + 1];
      sC[g + 8][col] = acc[nt * 4 + 2];
      sC[g + 8][col + 1] = acc[nt * 4 + 3];
    }
  } else {
    const int r = tid % kBlockM, g = tid / kBlockM;
#pragma unroll
    for (int i = 0; i < 8; ++i) sC[r][g + 8 * i] = acc[i];
  }
  __syncthreads();
  if (Gate) {
    T* act = static_cast<T*>(p.c);
    for (int idx = tid; idx < kBlockM * (kBN / 2); idx += kThreads) {
      const int r = idx / (kBN / 2), j = idx % (kBN / 2);
      if (c0 + j < p.N)
        act[int64_t(bx * kBlockM + r) * p.N + c0 + j] = st<T>(moe::silu(sC[r][j]) * sC[r][kBN / 2 + j]);
    }
  } else {
    float* y = static_cast<float*>(p.c);
    for (int idx = tid; idx < kBlockM * kBN; idx += kThreads) {
      const int r = idx / kBN, j = idx % kBN;
      const int pair = p.sorted[bx * kBlockM + r];
      if (pair < p.numel && c0 + j < p.N) y[int64_t(pair) * p.N + c0 + j] = sC[r][j];
    }
  }
}

template <typename T>
__global__ void moe_sum_kernel(T* out, int64_t out_stride, const float* y, const float* topk_weights,
                               const int32_t* ids, const int32_t* expert_map, int map_size, int E, int k, int H) {
  const int64_t t = blockIdx.x;
  for (int h = threadIdx.x; h < H; h += blockDim.x) {
    float s = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t pair = t * k + j;
      if (moe::local_expert(ids[pair], expert_map, map_size, E) >= 0) s += topk_weights[pair] * y[pair * H + h];
    }
    out[t * out_stride + h] = st<T>(s);
  }
}

void launch_align(const int32_t* ids, int numel, const TensorView* expert_map, int E, int B, int32_t* sorted,
                  int n_sorted, int32_t* blocks, int n_blocks, int32_t* npad, int64_t stream) {
  LLMK_LAUNCH(align_kernel, 1, kAlignThreads, (2 * E + 1) * sizeof(int), stream)(
      ids, numel, expert_map ? expert_map->ptr<const int32_t>() : nullptr,
      expert_map ? int(expert_map->size(0)) : 0, E, B, sorted, n_sorted, blocks, n_blocks, npad);
}

}  // namespace

void topk_softmax(const TensorView& weights, const TensorView& ids, const TensorView& gating, bool renormalize,
                  int64_t stream) {
  const int T_ = int(gating.size(0));
  by_dtype(gating.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    LLMK_LAUNCH(topk_softmax_kernel<T>, unsigned((T_ + 127) / 128), 128, 0, stream)(
        weights.ptr<float>(), ids.ptr<int32_t>(), gating.ptr<const T>(), gating.stride(0), T_,
        int(gating.size(1)), int(ids.size(1)), renormalize);
  });
}

void moe_align_block_size(const TensorView& topk_ids, const TensorView* expert_map, int64_t num_experts,
                          int64_t block_size, const TensorView& sorted_ids, const TensorView& expert_ids,
                          const TensorView& num_post_pad, int64_t stream) {
  launch_align(topk_ids.ptr<const int32_t>(), int(topk_ids.numel()), expert_map, int(num_experts),
               int(block_size), sorted_ids.ptr<int32_t>(), int(sorted_ids.numel()), expert_ids.ptr<int32_t>(),
               int(expert_ids.numel()), num_post_pad.ptr<int32_t>(), stream);
}

void fused_moe(const TensorView& out, const TensorView& x, const TensorView& w13, const TensorView& w2,
               const TensorView& topk_weights, const TensorView& topk_ids, const TensorView* expert_map,
               const TensorView* workspace, int64_t stream) {
  const int E = int(w13.size(0)), H = int(w2.size(1)), I = int(w2.size(2));
  const int numel = int(topk_ids.numel()), k = int(topk_ids.size(1));
  const moe::Workspace L = moe::Workspace::layout(numel, E, H, I, int64_t(x.elem_size()));
  char* ws = static_cast<char*>(workspace->data);
  int32_t* sorted = reinterpret_cast<int32_t*>(ws + L.sorted);
  int32_t* blocks = reinterpret_cast<int32_t*>(ws + L.blocks);
  int32_t* npad = reinterpret_cast<int32_t*>(ws + L.npad);
  launch_align(topk_ids.ptr<const int32_t>(), numel, expert_map, E, kBlockM, sorted, int(L.n_sorted), blocks,
               int(L.n_blocks), npad, stream);
  by_dtype(x.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const size_t el = sizeof(T);
    GemmArgs g{x.data, x.stride(0), w13.data, 2 * int64_t(I), H, I, sorted, blocks, npad, numel, k, ws + L.act,
               vec_ok(x.data, x.stride(0), w13.data, H, el)};
    LLMK_LAUNCH((grouped_gemm_kernel<T, true>), dim3(unsigned(L.n_blocks), unsigned((I + kBN / 2 - 1) / (kBN / 2))),
                kThreads, 0, stream)(g);
    GemmArgs d{ws + L.act, I, w2.data, H, I, H, sorted, blocks, npad, numel, k, ws + L.y,
               vec_ok(ws + L.act, I, w2.data, I, el)};
    LLMK_LAUNCH((grouped_gemm_kernel<T, false>), dim3(unsigned(L.n_blocks), unsigned((H + kBN - 1) / kBN)),
                kThreads, 0, stream)(d);
    LLMK_LAUNCH(moe_sum_kernel<T>, unsigned(x.size(0)), 256, 0, stream)(
        out.ptr<T>(), out.stride(0), reinterpret_cast<const float*>(ws + L.y), topk_weights.ptr<const float>(),
        topk_ids.ptr<const int32_t>(), expert_map ? expert_map->ptr<const int32_t>() : nullptr,
        expert_map ? int(expert_map->size(0)) : 0, E, k, H);
  });
}

void fused_moe_packed(const TensorView&, const TensorView&, const TensorView&, const TensorView&, int64_t,
                      const TensorView&, const TensorView&, const TensorView*, int64_t) {
  throw NotImplementedError("fused_moe: packed experts (pack_moe_weights) are for the CPU; pass w13 and w2");
}

}  // namespace gpu
}  // namespace llmk
