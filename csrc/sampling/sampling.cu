// CUDA kernels of the sampling ops: sorting-free rejection sampling with pivots (sample_rows) and
// exact pivot searches for renormalisation / masking (renorm_rows). One CTA per output row; the
// per-row algorithms are row_algo.h's (shared with the CPU kernels), the passes sampling_row.cuh's.
#include "common/device_memory.h"
#include "sampling/sampling.h"
#include "sampling/sampling_row.cuh"
#include "sampling/sampling_launch.cuh"

namespace llmk {
namespace gpu {

namespace {

using namespace samp;

struct SampleK {
  const void* x;
  int64_t row_stride;  // elements
  int64_t V;
  const void* indices;
  int idx64;
  int is_logits;
  int k_first;
  int out64;
  DParam temperature, top_k, top_p, min_p, seed, offset;
  const int32_t* bitmask;  // [batch, words] or null
  int64_t bm_stride;
  void* out;
  bool* valid;
};

// Row i of an optional [rows, words] token bitmask.
LLMK_DEVICE const int32_t* mask_row(const int32_t* m, int64_t stride, int64_t i) {
  return m ? m + i * stride : nullptr;
}
inline const int32_t* bitmask_ptr(const TensorView* t) { return t ? t->ptr<const int32_t>() : nullptr; }
inline int64_t bitmask_stride(const TensorView* t) { return t ? t->stride(0) : 0; }

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) sample_rows_kernel(SampleK a) {
  __shared__ RowSmem sm;
  const int64_t i = blockIdx.x;
  const int64_t src_row = a.indices ? read_index(a.indices, a.idx64 != 0, i) : i;
  const T* x = static_cast<const T*>(a.x) + src_row * a.row_stride;
  const RowFilter f{a.top_k.i64(i), static_cast<float>(a.top_p.f(i)), static_cast<float>(a.min_p.f(i)),
                    a.k_first != 0};
  const RowRng rng = RowRng::make(a.seed.u64(i), a.offset.u64(i), static_cast<uint32_t>(i));
  const int32_t* mask = mask_row(a.bitmask, a.bm_stride, i);
  RowResult res;
  if (a.is_logits) {
    Loaded L;
    const LogitsSrc<T> w = load_logits(x, a.V, static_cast<float>(a.temperature.f(i)), L, sm, mask);
    DeviceRow<LogitsSrc<T>> r{w, sm};
    res = sample_loaded(r, L, f, rng);
  } else {
    const ProbsSrc<T> w(x, a.V, mask, 0.0f);
    PivotStats st[1];
    const RowMax mx = row_load(w, 0.0f, st, sm);
    const Loaded L{st[0].mass, st[0].cnt, st[0].min_gt, mx.max_w, mx.argmax, degenerate_mass(st[0].mass), false};
    DeviceRow<ProbsSrc<T>> r{w, sm};
    res = sample_loaded(r, L, f, rng);
  }
  if (threadIdx.x == 0) {
    if (a.out64) static_cast<int64_t*>(a.out)[i] = res.token;
    else static_cast<int32_t*>(a.out)[i] = static_cast<int32_t>(res.token);
    a.valid[i] = res.valid;
  }
}

struct SoftmaxK {
  const void* x;
  int64_t x_stride;
  float* out;
  int64_t out_stride;
  int64_t V;
  DParam temperature;
  const int32_t* bitmask;
  int64_t bm_stride;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) softmax_rows_kernel(SoftmaxK a) {
  __shared__ RowSmem sm;
  const int64_t i = blockIdx.x;
  float* out = a.out + i * a.out_stride;
  Loaded L;
  const LogitsSrc<T> w = load_logits(static_cast<const T*>(a.x) + i * a.x_stride, a.V,
                                     static_cast<float>(a.temperature.f(i)), L, sm,
                                     mask_row(a.bitmask, a.bm_stride, i));
  constexpr int N = LogitsSrc<T>::N;
  for_each_vec(w, [&](int64_t v, const float (&e)[N]) {
#pragma unroll
    for (int q = 0; q < N; ++q) {
      const int64_t j = v * N + q;
      if (j < a.V) out[j] = L.degenerate ? 0.0f : L.done ? (j == L.argmax ? 1.0f : 0.0f) : e[q];
    }
  });
}

struct RenormK {
  const void* x;
  int64_t x_stride;
  void* out;
  int64_t out_stride;
  int64_t V;
  int kind;
  DParam param;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) renorm_rows_kernel(RenormK a) {
  __shared__ RowSmem sm;
  const int64_t i = blockIdx.x;
  const T* x = static_cast<const T*>(a.x) + i * a.x_stride;
  T* out = static_cast<T*>(a.out) + i * a.out_stride;
  const ProbsSrc<T> src(x, a.V);
  const bool mask = a.kind == static_cast<int>(RenormKind::MaskLogitsTopK);
  DeviceRow<ProbsSrc<T>> r{src, sm};
  PivotStats st[1];
  const RowMax mx = row_load(src, mask ? -INFINITY : 0.0f, st, sm);
  const int64_t k = a.param.i64(i);
  float lo;
  double inv = 0.0;
  if (mask) {
    // exact top-k threshold on the logits themselves (signed; -inf and NaN never counted)
    lo = mask_threshold(r, k, st[0].cnt, st[0].min_gt, mx.max_w);
  } else {
    const Loaded L{st[0].mass, st[0].cnt, st[0].min_gt, mx.max_w, mx.argmax, degenerate_mass(st[0].mass), false};
    const RenormPlan plan = renorm_plan(r, L, static_cast<RenormKind>(a.kind), k, static_cast<float>(a.param.f(i)),
                                        static_cast<uint32_t>(i));
    lo = plan.lo;
    inv = plan.inv;
  }
  // write pass: 16-byte loads (kUnroll in flight) and stores when both rows allow them
  constexpr int N = RowLoader<T>::N;
  const bool vec = aligned16(x) && aligned16(out);
  const int64_t nv = (a.V + N - 1) / N, nt = blockDim.x;
  auto value = [&](T e, T* o) {
    if (!mask) from_f(renorm_value(to_f(e), lo, inv), o);
    else if (to_f(e) > lo) *o = e;
    else from_f(-INFINITY, o);
  };
  for (int64_t v0 = threadIdx.x; v0 < nv; v0 += nt * kUnroll) {
    uint4 in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j0 = (v0 + u * nt) * N;
      if (vec && j0 + N <= a.V) in[u] = *reinterpret_cast<const uint4*>(x + j0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j0 = (v0 + u * nt) * N;
      if (vec && j0 + N <= a.V) {
        const T* e = reinterpret_cast<const T*>(&in[u]);
        uint4 r;
        T* o = reinterpret_cast<T*>(&r);
#pragma unroll
        for (int q = 0; q < N; ++q) value(e[q], &o[q]);
        *reinterpret_cast<uint4*>(out + j0) = r;
      } else {
        for (int64_t j = j0; j < j0 + N && j < a.V; ++j) value(x[j], &out[j]);
      }
    }
  }
}

}  // namespace

void sample_rows(const SampleArgs& a) {
  const int64_t V = a.x.size(1);
  SampleK k;
  k.x = a.x.data;
  k.row_stride = a.x.stride(0);
  k.V = V;
  k.indices = a.indices ? a.indices->data : nullptr;
  k.idx64 = a.indices && a.indices->dtype == DType::I64;
  k.is_logits = a.is_logits;
  k.k_first = a.k_first;
  k.out64 = a.out.dtype == DType::I64;
  k.temperature = dparam(a.temperature);
  k.top_k = dparam(a.top_k);
  k.top_p = dparam(a.top_p);
  k.min_p = dparam(a.min_p);
  k.seed = dparam(a.seed);
  k.offset = dparam(a.offset);
  k.bitmask = bitmask_ptr(a.bitmask);
  k.bm_stride = bitmask_stride(a.bitmask);
  k.out = a.out.data;
  k.valid = a.valid.ptr<bool>();
  const unsigned grid = static_cast<unsigned>(a.batch);
  const int threads = row_threads(V, static_cast<int>(a.x.elem_size()));
  switch (a.x.dtype) {
    case DType::F32: LLMK_LAUNCH(sample_rows_kernel<float>, grid, threads, 0, a.stream)(k); break;
    case DType::F16: LLMK_LAUNCH(sample_rows_kernel<__half>, grid, threads, 0, a.stream)(k); break;
    default: LLMK_LAUNCH(sample_rows_kernel<__nv_bfloat16>, grid, threads, 0, a.stream)(k); break;
  }
  check_launch("sample_rows");
}

void softmax_rows(const SoftmaxArgs& a) {
  const int64_t V = a.x.size(1);
  SoftmaxK k{a.x.data, a.x.stride(0), a.out.ptr<float>(), a.out.stride(0), V, dparam(a.temperature),
             bitmask_ptr(a.bitmask), bitmask_stride(a.bitmask)};
  const unsigned grid = static_cast<unsigned>(a.x.size(0));
  const int threads = row_threads(V, static_cast<int>(a.x.elem_size()));
  switch (a.x.dtype) {
    case DType::F32: LLMK_LAUNCH(softmax_rows_kernel<float>, grid, threads, 0, a.stream)(k); break;
    case DType::F16: LLMK_LAUNCH(softmax_rows_kernel<__half>, grid, threads, 0, a.stream)(k); break;
    default: LLMK_LAUNCH(softmax_rows_kernel<__nv_bfloat16>, grid, threads, 0, a.stream)(k); break;
  }
  check_launch("softmax");
}

void renorm_rows(const RenormArgs& a) {
  const int64_t V = a.x.size(1);
  RenormK k;
  k.x = a.x.data;
  k.x_stride = a.x.stride(0);
  k.out = a.out.data;
  k.out_stride = a.out.stride(0);
  k.V = V;
  k.kind = static_cast<int>(a.kind);
  k.param = dparam(a.param);
  const unsigned grid = static_cast<unsigned>(a.x.size(0));
  const int threads = row_threads(V, static_cast<int>(a.x.elem_size()));
  switch (a.x.dtype) {
    case DType::F32: LLMK_LAUNCH(renorm_rows_kernel<float>, grid, threads, 0, a.stream)(k); break;
    case DType::F16: LLMK_LAUNCH(renorm_rows_kernel<__half>, grid, threads, 0, a.stream)(k); break;
    default: LLMK_LAUNCH(renorm_rows_kernel<__nv_bfloat16>, grid, threads, 0, a.stream)(k); break;
  }
  check_launch("renorm_rows");
}

}  // namespace gpu
}  // namespace llmk
