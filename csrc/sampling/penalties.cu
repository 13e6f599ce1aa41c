// CUDA kernel of apply_penalties (vLLM semantics, rule in sampling_math.h): one CTA per row.
// Dense inputs (output counts, prompt mask) take one coalesced pass over the row. Token-id inputs
// are tagged (id << 1 | from_prompt), sorted in shared memory (bitonic) and walked run by run: the
// first entry of each token's run applies the penalty once, with the output count read off the
// run. Rows with more ids than shared memory holds use a slower quadratic walk over global memory.
// Every token is written by exactly one thread, so no atomics are needed.
#include "common/device_memory.h"
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"
#include "sampling/sampling_launch.cuh"

namespace llmk {
namespace gpu {

namespace {

using namespace samp;

constexpr int kPenaltyThreads = 512;
constexpr int64_t kMaxKeys = 32768;  // 128 KiB of shared memory
constexpr uint32_t kPad = 0xffffffffu;

struct PenK {
  void* logits;
  int64_t ls;  // row stride (elements)
  int64_t V;
  const void* counts;  // [b, V] contiguous
  int counts64;
  const void* out_ids;  // [b, L]
  int out64;
  int64_t L;
  const bool* pmask;  // [b, V]
  const void* prompt_ids;  // [b, Lp]
  int prompt64;
  int64_t Lp;
  int nkeys;  // power of two >= L + Lp when the ids are sorted in shared memory, else 0
  DParam rep, freq, pres;
};

// First position in keys[lo, n) whose key is >= k (keys sorted ascending).
LLMK_DEVICE int lower_bound(const uint32_t* keys, int lo, int n, uint32_t k) {
  int hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (keys[mid] < k) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

template <typename T>
LLMK_DEVICE void penalise(T* x, int64_t j, int64_t count, float rep, float freq, float pres) {
  from_f(apply_penalty(to_f(x[j]), true, count, rep, freq, pres), &x[j]);
}

// A token id of an id list, or -1 for padding (-1 / vocab_size) and anything outside [0, V).
LLMK_DEVICE int64_t list_id(const void* ids, bool is64, int64_t i, int64_t V) {
  const int64_t id = read_index(ids, is64, i);
  return id >= 0 && id < V ? id : -1;
}

template <typename T>
__global__ void __launch_bounds__(kPenaltyThreads) apply_penalties_kernel(PenK a) {
  LLMK_DYNAMIC_SMEM(uint32_t, keys);
  const int64_t b = blockIdx.x, V = a.V;
  const int tid = threadIdx.x, nt = blockDim.x;
  T* x = static_cast<T*>(a.logits) + b * a.ls;
  const float rep = static_cast<float>(a.rep.f(b)), freq = static_cast<float>(a.freq.f(b)),
              pres = static_cast<float>(a.pres.f(b));
  const int64_t L = a.out_ids ? a.L : 0, Lp = a.prompt_ids ? a.Lp : 0;
  const void* oid = a.out_ids ? static_cast<const char*>(a.out_ids) + b * L * (a.out64 ? 8 : 4) : nullptr;
  const void* pid = a.prompt_ids ? static_cast<const char*>(a.prompt_ids) + b * Lp * (a.prompt64 ? 8 : 4) : nullptr;
  const int n = a.nkeys;
  if (n > 0) {
    for (int i = tid; i < n; i += nt) {
      uint32_t k = kPad;
      if (i < L) {
        const int64_t id = list_id(oid, a.out64 != 0, i, V);
        if (id >= 0) k = static_cast<uint32_t>(id) << 1;
      } else if (i < L + Lp) {
        const int64_t id = list_id(pid, a.prompt64 != 0, i - L, V);
        if (id >= 0) k = (static_cast<uint32_t>(id) << 1) | 1u;
      }
      keys[i] = k;
    }
    __syncthreads();
    // bitonic sort, ascending
    for (int size = 2; size <= n; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < n; i += nt) {
          const int o = i ^ stride;
          if (o > i) {
            const uint32_t u = keys[i], w = keys[o];
            if ((u > w) == ((i & size) == 0)) {
              keys[i] = w;
              keys[o] = u;
            }
          }
        }
        __syncthreads();
      }
    }
  }
  const int64_t* c64 = a.counts && a.counts64 ? static_cast<const int64_t*>(a.counts) + b * V : nullptr;
  const int32_t* c32 = a.counts && !a.counts64 ? static_cast<const int32_t*>(a.counts) + b * V : nullptr;
  auto count_of = [&](int64_t j) -> int64_t { return c64 ? c64[j] : c32[j]; };
  // Is token j in the output ids?
  auto in_output = [&](int64_t j) -> bool {
    if (n > 0) {
      const uint32_t k = static_cast<uint32_t>(j) << 1;
      const int p = lower_bound(keys, 0, n, k);
      return p < n && keys[p] == k;
    }
    for (int64_t i = 0; i < L; ++i)
      if (list_id(oid, a.out64 != 0, i, V) == j) return true;
    return false;
  };

  // Dense pass: tokens with an output count, and prompt-mask tokens not in the output ids.
  if (a.counts || a.pmask) {
    const bool* pm = a.pmask ? a.pmask + b * V : nullptr;
    for (int64_t j = tid; j < V; j += nt) {
      if (a.counts) {
        const int64_t c = count_of(j);
        if (c > 0) penalise(x, j, c, rep, freq, pres);
        else if (pm && pm[j]) penalise(x, j, 0, rep, freq, pres);
      } else if (pm[j] && !(L > 0 && in_output(j))) {
        penalise(x, j, 0, rep, freq, pres);
      }
    }
  }

  // Id pass: each distinct listed token once. Tokens with a dense output count > 0 were done above.
  if (n > 0) {
    for (int i = tid; i < n; i += nt) {
      const uint32_t k = keys[i];
      if (k == kPad) continue;
      const uint32_t id = k >> 1;
      if (i > 0 && (keys[i - 1] >> 1) == id) continue;  // not the first entry of its run
      const int64_t c = lower_bound(keys, i, n, (id << 1) | 1u) - i;  // output entries sort first
      if (a.counts && count_of(id) > 0) continue;
      penalise(x, id, c, rep, freq, pres);
    }
  } else {
    for (int64_t i = tid; i < L; i += nt) {
      const int64_t id = list_id(oid, a.out64 != 0, i, V);
      if (id < 0) continue;
      bool first = true;
      for (int64_t e = 0; e < i && first; ++e) first = list_id(oid, a.out64 != 0, e, V) != id;
      if (!first) continue;
      int64_t c = 1;
      for (int64_t e = i + 1; e < L; ++e) c += list_id(oid, a.out64 != 0, e, V) == id ? 1 : 0;
      penalise(x, id, c, rep, freq, pres);
    }
    for (int64_t i = tid; i < Lp; i += nt) {
      const int64_t id = list_id(pid, a.prompt64 != 0, i, V);
      if (id < 0) continue;
      bool first = true;
      for (int64_t e = 0; e < i && first; ++e) first = list_id(pid, a.prompt64 != 0, e, V) != id;
      if (!first || (a.counts && count_of(id) > 0) || (L > 0 && in_output(id))) continue;
      penalise(x, id, 0, rep, freq, pres);
    }
  }
}

template <typename T>
void launch_penalties(const PenK& k, unsigned grid, int64_t stream) {
  const int smem = k.nkeys * static_cast<int>(sizeof(uint32_t));
  if (smem > 48 * 1024) simt::set_max_dynamic_smem(apply_penalties_kernel<T>, smem);
  LLMK_LAUNCH(apply_penalties_kernel<T>, grid, kPenaltyThreads, smem, stream)(k);
}

}  // namespace

void apply_penalties(const PenaltyArgs& a) {
  PenK k;
  k.logits = a.logits.data;
  k.ls = a.logits.stride(0);
  k.V = a.logits.size(1);
  k.counts = a.output_counts ? a.output_counts->data : nullptr;
  k.counts64 = a.output_counts && a.output_counts->dtype == DType::I64;
  k.out_ids = a.output_ids ? a.output_ids->data : nullptr;
  k.out64 = a.output_ids && a.output_ids->dtype == DType::I64;
  k.L = a.output_ids ? a.output_ids->size(1) : 0;
  k.pmask = a.prompt_mask ? a.prompt_mask->ptr<const bool>() : nullptr;
  k.prompt_ids = a.prompt_ids ? a.prompt_ids->data : nullptr;
  k.prompt64 = a.prompt_ids && a.prompt_ids->dtype == DType::I64;
  k.Lp = a.prompt_ids ? a.prompt_ids->size(1) : 0;
  const int64_t total = k.L + k.Lp;
  int64_t n = 0;
  if (total > 0 && total <= kMaxKeys) {
    n = 2;
    while (n < total) n <<= 1;
  }
  k.nkeys = static_cast<int>(n);
  k.rep = dparam(a.repetition);
  k.freq = dparam(a.frequency);
  k.pres = dparam(a.presence);
  const unsigned grid = static_cast<unsigned>(a.logits.size(0));
  switch (a.logits.dtype) {
    case DType::F32: launch_penalties<float>(k, grid, a.stream); break;
    case DType::F16: launch_penalties<__half>(k, grid, a.stream); break;
    default: launch_penalties<__nv_bfloat16>(k, grid, a.stream); break;
  }
  check_launch("apply_penalties");
}

}  // namespace gpu
}  // namespace llmk
