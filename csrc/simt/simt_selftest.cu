// Self-test kernels of the SIMT layer: each exercises one feature and writes raw results that
// tests/test_simt_layer.py checks against expectations derived from the CUDA / PTX documentation.
#include "simt/simt_selftest.h"

#include "common/device_memory.h"
#include "common/simt.h"
#include "common/simt_block.h"

namespace llmk {
namespace gpu {

namespace {

// ---- warp collectives ---------------------------------------------------------------------------

__global__ void warp_kernel(const int* in, const int* ops, int nops, int* out) {
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  const int lane = simt::lane_id();
  const int v = in[t];
  for (int i = 0; i < nops; ++i) {
    const int op = ops[3 * i], operand = ops[3 * i + 1], width = ops[3 * i + 2];
    const unsigned lanes = static_cast<unsigned>(operand);
    int r = -1;
    switch (op) {
      case 0: r = __shfl_sync(0xffffffffu, v, operand, width); break;
      case 1: r = __shfl_up_sync(0xffffffffu, v, static_cast<unsigned>(operand), width); break;
      case 2: r = __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(operand), width); break;
      case 3: r = __shfl_xor_sync(0xffffffffu, v, operand, width); break;
      case 4: r = static_cast<int>(__ballot_sync(0xffffffffu, (v >> operand) & 1)); break;
      case 5: r = __any_sync(0xffffffffu, (v >> operand) & 1); break;
      case 6: r = __all_sync(0xffffffffu, (v >> operand) & 1); break;
      case 7:
        if (lanes >> lane & 1u) r = __shfl_xor_sync(lanes, v, 1);
        break;
      case 8:
        if (lanes >> lane & 1u) r = static_cast<int>(__ballot_sync(lanes, v & 1));
        break;
      default: r = static_cast<int>(__activemask()); break;
    }
    __syncwarp();
    out[i * n + t] = r;
  }
}

// ---- barriers and indices --------------------------------------------------------------------------

__global__ void barrier_kernel(int* out) {
  __shared__ int counter;
  const int nthreads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int t = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int b = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  if (t == 0) counter = 0;
  __syncthreads();
  atomicAdd(&counter, 1);
  __syncthreads();
  const int phase1 = counter;
  __syncthreads();
  atomicAdd(&counter, 2);
  __syncthreads();
  const int phase2 = counter;
  const int count = __syncthreads_count(t % 3 == 0);
  const int any_last = __syncthreads_or(t == nthreads - 1);
  const int all_true = __syncthreads_and(t >= 0);
  int* o = out + (static_cast<int64_t>(b) * nthreads + t) * 10;
  o[0] = static_cast<int>(threadIdx.x);
  o[1] = static_cast<int>(threadIdx.y);
  o[2] = static_cast<int>(threadIdx.z);
  o[3] = b;
  o[4] = simt::lane_id();
  o[5] = simt::warp_id();
  o[6] = phase1;
  o[7] = phase2;
  o[8] = count;
  o[9] = (any_last ? 1 : 0) + 2 * (all_true ? 1 : 0);
}

// ---- block reductions and scans ----------------------------------------------------------------------

__global__ void block_kernel(const float* x, float* out, const int* xi, int* outi) {
  __shared__ float scratch[32];
  __shared__ int iscratch[32];
  const int n = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * n + t;
  const float v = x[i];
  float total = 0.0f;
  const float sum = block_reduce_sum(v, scratch);
  const float mx = block_reduce_max(v, scratch);
  const float incl = block_inclusive_scan(v, scratch);
  const float excl = block_exclusive_scan(v, scratch, &total);
  out[i * 5 + 0] = sum;
  out[i * 5 + 1] = mx;
  out[i * 5 + 2] = incl;
  out[i * 5 + 3] = excl;
  out[i * 5 + 4] = total;
  outi[i * 2 + 0] = block_reduce_sum(xi[i], iscratch);
  outi[i * 2 + 1] = block_inclusive_scan(xi[i], iscratch);
}

// ---- atomics -----------------------------------------------------------------------------------------

__global__ void atomics_kernel(int* ic, unsigned* uc, unsigned long long* ull, float* f) {
  const int gid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(&ic[0], 1);
  atomicAdd(&ic[1], gid);
  atomicMax(&ic[2], (gid * 37) % 1000);
  atomicMin(&ic[3], 5000 - (gid * 37) % 1000);
  int old = ic[4], assumed;
  do {  // increment by 3 through a compare-and-swap loop
    assumed = old;
    old = atomicCAS(&ic[4], assumed, assumed + 3);
  } while (old != assumed);
  atomicExch(&ic[5], gid);
  atomicAdd(&uc[0], 3u);
  atomicMax(&uc[1], static_cast<unsigned>(gid) * 2u);
  atomicAdd(&ull[0], 1ull << 33);
  atomicAdd(&f[0], 0.5f);
}

// ---- dynamic shared memory ------------------------------------------------------------------------

__global__ void dynamic_smem_kernel(int* out, int n) {
  LLMK_DYNAMIC_SMEM(int, s);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) s[i] = 3 * i + 1;
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) out[i] = s[n - 1 - i];
  if (threadIdx.x == 0) out[n] = (reinterpret_cast<uintptr_t>(s) & 15u) == 0 ? 1 : 0;
}

// ---- cp.async -------------------------------------------------------------------------------------------

__global__ void cp_async_kernel(const int4* src, const int* src_bytes, int4* out) {
  __shared__ int4 stage0[128];
  __shared__ int4 stage1[128];
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  stage0[t] = make_int4(-7, -7, -7, -7);
  stage1[t] = make_int4(-7, -7, -7, -7);
  __syncthreads();
  simt::cp_async_16(&stage0[t], &src[t], src_bytes[t]);
  simt::cp_async_commit();
  simt::cp_async_16(&stage1[t], &src[(t + 1) % n], 16);
  simt::cp_async_commit();
  simt::cp_async_wait<1>();  // the first group has landed
  __syncthreads();
  out[t] = stage0[(t + 5) % n];  // written by another thread
  simt::cp_async_wait<0>();
  __syncthreads();
  out[n + t] = stage1[(t + 3) % n];
}

// ---- ldmatrix and mma -------------------------------------------------------------------------------

__global__ void ldmatrix_kernel(const uint4* rows, const int* perm, uint32_t* out) {
  __shared__ uint4 tile[32];
  const int l = static_cast<int>(threadIdx.x);
  tile[l] = rows[l];
  __syncthreads();
  const void* p = &tile[perm[l]];
  uint32_t r[6][4] = {};
  simt::ldmatrix_x1(r[0], p);
  simt::ldmatrix_x2(r[1], p);
  simt::ldmatrix_x4(r[2], p);
  simt::ldmatrix_x1_trans(r[3], p);
  simt::ldmatrix_x2_trans(r[4], p);
  simt::ldmatrix_x4_trans(r[5], p);
  for (int v = 0; v < 6; ++v)
    for (int j = 0; j < 4; ++j) out[(v * 32 + l) * 4 + j] = r[v][j];
}

__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d, bool fp16) {
  const int l = static_cast<int>(threadIdx.x);
  uint32_t ra[4], rb[2];
  float rc[4], rd[4];
  for (int i = 0; i < 4; ++i) ra[i] = a[l * 4 + i];
  for (int i = 0; i < 2; ++i) rb[i] = b[l * 2 + i];
  for (int i = 0; i < 4; ++i) rc[i] = c[l * 4 + i];
  if (fp16) simt::mma_m16n8k16_f16(rd, ra, rb, rc);
  else simt::mma_m16n8k16_bf16(rd, ra, rb, rc);
  for (int i = 0; i < 4; ++i) d[l * 4 + i] = rd[i];
}

__global__ void ldmatrix_mma_kernel(const uint4* a, const uint4* b, float* out, bool fp16) {
  __shared__ uint4 sa[32];  // 16 rows x 16 halves: row r = sa[2r], sa[2r + 1]
  __shared__ uint4 sb[16];  // 16 rows (k) x 8 halves (n)
  const int l = static_cast<int>(threadIdx.x);
  sa[l] = a[l];
  if (l < 16) sb[l] = b[l];
  __syncthreads();
  uint32_t ra[4], rb[2];
  simt::ldmatrix_x4(ra, &sa[2 * (l % 16) + l / 16]);  // row l % 16, column block l / 16
  simt::ldmatrix_x2_trans(rb, &sb[l % 16]);           // lanes 0-15: k rows 0-15
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (fp16) simt::mma_m16n8k16_f16(acc, ra, rb, acc);
  else simt::mma_m16n8k16_bf16(acc, ra, rb, acc);
  const int g = l >> 2, t = l & 3;
  for (int i = 0; i < 4; ++i) out[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = acc[i];
}

// ---- conversions and math ----------------------------------------------------------------------------

__global__ void convert_kernel(const float* x, int n, unsigned short* h, unsigned short* bf, float* back,
                               uint32_t* pairs, float* math) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    const float v = x[i];
    const __half hv = __float2half_rn(v);
    const __nv_bfloat16 bv = __float2bfloat16_rn(v);
    h[i] = __half_as_ushort(hv);
    bf[i] = __bfloat16_as_ushort(bv);
    back[i] = __half2float(hv);
    back[n + i] = __bfloat162float(bv);
    if (i % 2 == 0 && i + 1 < n) {
      const __half2 h2 = __floats2half2_rn(v, x[i + 1]);
      const __nv_bfloat162 b2 = __floats2bfloat162_rn(v, x[i + 1]);
      pairs[i / 2] = static_cast<uint32_t>(__half_as_ushort(__float2half(__low2float(h2)))) |
                     (static_cast<uint32_t>(__half_as_ushort(__float2half(__high2float(h2)))) << 16);
      pairs[n / 2 + i / 2] =
          static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16(__low2float(b2)))) |
          (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16(__high2float(b2)))) << 16);
    }
    const float a = fabsf(v) + 0.5f;
    math[0 * n + i] = __expf(fminf(v, 10.0f));
    math[1 * n + i] = exp2f(fminf(fmaxf(v, -10.0f), 10.0f));
    math[2 * n + i] = __logf(a);
    math[3 * n + i] = rsqrtf(a);
    math[4 * n + i] = __fdividef(v, a);
    math[5 * n + i] = tanhf(v);
    math[6 * n + i] = __fmaf_rn(v, a, 1.0f);
    math[7 * n + i] = __int_as_float(__float_as_int(v) ^ static_cast<int>(0x80000000u)) +
                      __uint_as_float(__float_as_uint(sqrtf(a)));
  }
}

// ---- planted bugs and speed (emulator only: host pointers, and on a GPU the bugs hang) -----------------
#if !defined(__CUDACC__)

__global__ void fault_kernel(int kind, int* sink) {
  const int t = static_cast<int>(threadIdx.x);
  int v = t;
  switch (kind) {
    case 0:  // __syncthreads inside a divergent branch, other threads at a later barrier
      if (t < 16) __syncthreads();
      __syncthreads();
      break;
    case 1:  // __syncthreads inside a divergent branch, other threads exit
      if (t < 16) __syncthreads();
      break;
    case 2:  // full-mask shuffle reached by half of the warp, the other half waits at a barrier
      if (t % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
      __syncthreads();
      break;
    case 3:  // calling lane outside its own mask
      v = __shfl_sync(0x0000ffffu, v, 0);
      break;
    case 4:  // different collectives with the same mask
      if (t % 2) v = __shfl_xor_sync(0xffffffffu, v, 1);
      else v = static_cast<int>(__ballot_sync(0xffffffffu, v));
      break;
    case 5:  // invalid shuffle width
      v = __shfl_xor_sync(0xffffffffu, v, 1, 12);
      break;
    case 7:  // full-mask shuffle reading a lane that has exited
      if (t % 32 >= 16) return;
      v = __shfl_xor_sync(0xffffffffu, v, 16);
      break;
    default:  // misaligned cp.async destination
      simt::cp_async_16(reinterpret_cast<char*>(sink) + 4, sink, 16);
      break;
  }
  sink[t] = v;
}

__global__ void spin_kernel(int iters, int* sink) {
  int v = static_cast<int>(threadIdx.x);
  for (int i = 0; i < iters; ++i) {
    __syncthreads();
    v += __shfl_xor_sync(0xffffffffu, v, 1) & 1;
  }
  sink[threadIdx.x] = v;
}
#endif

}  // namespace

void selftest_warp(const TensorView& in, const TensorView& ops, const TensorView& out, int64_t stream) {
  LLMK_LAUNCH(warp_kernel, 1, static_cast<unsigned>(in.size(0)), 0, stream)(
      in.ptr<const int>(), ops.ptr<const int>(), static_cast<int>(ops.size(0)), out.ptr<int>());
  check_launch("selftest_warp");
}

void selftest_barrier(const TensorView& out, int bx, int by, int bz, int gx, int gy, int64_t stream) {
  LLMK_LAUNCH(barrier_kernel, dim3(gx, gy), dim3(bx, by, bz), 0, stream)(out.ptr<int>());
  check_launch("selftest_barrier");
}

void selftest_block(const TensorView& x, const TensorView& out, const TensorView& xi, const TensorView& outi,
                    int64_t stream) {
  LLMK_LAUNCH(block_kernel, static_cast<unsigned>(x.size(0)), static_cast<unsigned>(x.size(1)), 0, stream)(
      x.ptr<const float>(), out.ptr<float>(), xi.ptr<const int>(), outi.ptr<int>());
  check_launch("selftest_block");
}

void selftest_atomics(const TensorView& icount, const TensorView& ucount, const TensorView& ull,
                      const TensorView& fsum, int blocks, int threads, int64_t stream) {
  LLMK_LAUNCH(atomics_kernel, blocks, threads, 0, stream)(
      icount.ptr<int>(), ucount.ptr<unsigned>(), ull.ptr<unsigned long long>(), fsum.ptr<float>());
  check_launch("selftest_atomics");
}

void selftest_dynamic_smem(const TensorView& out, int64_t smem_bytes, bool opt_in, int64_t stream) {
  if (opt_in) simt::set_max_dynamic_smem(dynamic_smem_kernel, static_cast<int>(smem_bytes));
  LLMK_LAUNCH(dynamic_smem_kernel, 1, 256, smem_bytes, stream)(out.ptr<int>(),
                                                               static_cast<int>(out.size(0) - 1));
  check_launch("selftest_dynamic_smem");
}

void selftest_cp_async(const TensorView& src, const TensorView& src_bytes, const TensorView& out, int64_t stream) {
  LLMK_LAUNCH(cp_async_kernel, 1, static_cast<unsigned>(src.size(0)), 0, stream)(
      src.ptr<const int4>(), src_bytes.ptr<const int>(), out.ptr<int4>());
  check_launch("selftest_cp_async");
}

void selftest_ldmatrix(const TensorView& rows, const TensorView& perm, const TensorView& out, int64_t stream) {
  LLMK_LAUNCH(ldmatrix_kernel, 1, 32, 0, stream)(rows.ptr<const uint4>(), perm.ptr<const int>(),
                                                 out.ptr<uint32_t>());
  check_launch("selftest_ldmatrix");
}

void selftest_mma(const TensorView& a, const TensorView& b, const TensorView& c, const TensorView& d, bool fp16,
                  int64_t stream) {
  LLMK_LAUNCH(mma_kernel, 1, 32, 0, stream)(a.ptr<const uint32_t>(), b.ptr<const uint32_t>(),
                                            c.ptr<const float>(), d.ptr<float>(), fp16);
  check_launch("selftest_mma");
}

void selftest_ldmatrix_mma(const TensorView& a, const TensorView& b, const TensorView& out, bool fp16,
                           int64_t stream) {
  LLMK_LAUNCH(ldmatrix_mma_kernel, 1, 32, 0, stream)(a.ptr<const uint4>(), b.ptr<const uint4>(),
                                                     out.ptr<float>(), fp16);
  check_launch("selftest_ldmatrix_mma");
}

void selftest_convert(const TensorView& x, const TensorView& half, const TensorView& bf16, const TensorView& back,
                      const TensorView& pairs, const TensorView& math, int64_t stream) {
  const int n = static_cast<int>(x.size(0));
  LLMK_LAUNCH(convert_kernel, (n + 255) / 256, 256, 0, stream)(
      x.ptr<const float>(), n, half.ptr<unsigned short>(), bf16.ptr<unsigned short>(), back.ptr<float>(),
      pairs.ptr<uint32_t>(), math.ptr<float>());
  check_launch("selftest_convert");
}

#if !defined(__CUDACC__)
void selftest_fault(int kind, int64_t stream) {
  __align__(16) int sink[64 + 4] = {};
  LLMK_LAUNCH(fault_kernel, 1, 64, 0, stream)(kind, sink);
  check_launch("selftest_fault");
}

void selftest_spin(int iters, int threads, int64_t stream) {
  int sink[1024];
  LLMK_LAUNCH(spin_kernel, 1, threads, 0, stream)(iters, sink);
  check_launch("selftest_spin");
}
#endif

}  // namespace gpu
}  // namespace llmk
