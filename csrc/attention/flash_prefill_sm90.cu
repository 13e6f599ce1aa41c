// Launcher of the sm_90a prefill kernel (flash_prefill_sm90.cuh) and the switch that selects it
// (use_sm90_prefill, or LLMKERN_SM90_PREFILL=1 in a CUDA process): on a CUDA build with sm_90a code
// when the current device is sm_90, under the SIMT emulator for any call it applies to. Off until
// turned on: the Python layer turns it on after checking it once per process on the GPU
// (llmkern.ops.sm90_check); bench/device_check.sh turns it on for its tests and benchmarks.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attention/flash_launch.h"
#include "attention/flash_prefill_sm90.cuh"
#include "attention/flash_prefill_sm90_launch.h"
#include "common/grid.h"
#include "common/sm90.h"

namespace llmk {
namespace gpu {
namespace attn {

namespace {

bool env_enabled() {
  const char* e = std::getenv("LLMKERN_SM90_PREFILL");
  return e && std::strcmp(e, "1") == 0;
}

std::atomic<bool> g_enabled{env_enabled()};
std::atomic<long> g_launches{0};

// [batches,] rows, heads, D with 16-bit elements (batches: dense cache entries or paged blocks):
// boxes of 64 columns x `box_heads` heads x `box_rows` rows (x 1 batch entry), 128-byte swizzle.
// batches 0: rank 3.
bool rows_map(simt::TensorMap* m, const void* base, int64_t rows, int heads, int d, int64_t row_stride,
              int64_t head_stride, int box_heads, int box_rows, int64_t batches = 0, int64_t batch_stride = 0) {
  const uint64_t dims[4] = {uint64_t(d), uint64_t(heads), uint64_t(rows), uint64_t(batches)};
  const uint64_t strides[3] = {uint64_t(head_stride) * 2, uint64_t(row_stride) * 2, uint64_t(batch_stride) * 2};
  const uint32_t box[4] = {64, uint32_t(box_heads), uint32_t(box_rows), 1};
  return simt::make_tensor_map(m, base, 2, batches ? 4 : 3, dims, strides, box, 128);
}


}  // namespace

bool use_sm90_prefill(bool on) { return g_enabled.exchange(on); }
long sm90_prefill_launches() { return g_launches.load(); }

bool sm90_prefill_selected(const KernelArgs& a, int padded_head_dim) {
  const AttnParams& p = a.p;
  if (!(padded_head_dim == 64 || padded_head_dim == 128 || padded_head_dim == 256) || p.head_dim != padded_head_dim)
    return false;
  const int tile_n = padded_head_dim > 128 ? Sm90Cfg<256>::kBlockN : Sm90Cfg<128>::kBlockN;
  if (p.dtype != DType::F16 && p.dtype != DType::BF16) return false;
  if (p.q_rows <= 0 || a.num_splits != 1 || a.pack > Sm90Cfg<128>::kBlockM) return false;
  if (p.block_table) {
    if (!sm90_page_size_ok(p.block_size, tile_n) || p.k_blocks <= 0) return false;
  } else if (p.k_rows <= 0 || !(p.cu_seqlens_k || p.k_batches > 0)) {
    return false;
  }
#if defined(__CUDACC__)
#if defined(LLMK_HAS_SM90A)
  return g_enabled.load() && device_is_sm90();
#else
  return false;
#endif
#else
  return g_enabled.load();
#endif
}

template <typename T, int kD>
bool launch_prefill_sm90(KernelArgs a, int64_t stream) {
  using Cfg = Sm90Cfg<kD>;
  const AttnParams& p = a.p;
  Sm90Args args;
  const int per_head = Cfg::kBlockM / a.pack;  // query positions per tile
  args.tile_rows = per_head * a.pack;
  const bool paged = p.block_table != nullptr;
  args.kv_box = paged && p.block_size < Cfg::kBlockN ? p.block_size : Cfg::kBlockN;
  const int64_t kv_rows = paged ? p.block_size : p.k_rows, kv_batches = paged ? p.k_blocks : p.k_batches;
  const int64_t k_outer = paged ? p.k_block_stride : p.k_batch_stride;
  const int64_t v_outer = paged ? p.v_block_stride : p.v_batch_stride;
  if (!rows_map(&args.q, p.q, p.q_rows, p.num_heads, p.head_dim, p.q_row_stride, p.q_head_stride, a.pack,
                per_head) ||
      !rows_map(&args.k, p.k, kv_rows, p.num_kv_heads, p.head_dim, p.k_row_stride, p.k_head_stride, 1, args.kv_box,
                kv_batches, k_outer) ||
      !rows_map(&args.v, p.v, kv_rows, p.num_kv_heads, p.head_dim, p.v_row_stride, p.v_head_stride, 1, args.kv_box,
                kv_batches, v_outer))
    return false;  // strides TMA cannot express: the caller falls back to the cp.async kernel
  a.m_blocks = int((int64_t(p.max_seqlen_q) * a.pack + args.tile_rows - 1) / args.tile_rows);
  const ScoreMode mode = score_mode(p);
  auto kernel = mode == kScoresFolded    ? &flash_prefill_sm90_kernel<T, Cfg, kScoresFolded>
                : mode == kScoresSoftcap ? &flash_prefill_sm90_kernel<T, Cfg, kScoresSoftcap>
                                         : &flash_prefill_sm90_kernel<T, Cfg, kScoresAlibi>;
  allow_dynamic_smem(kernel, Cfg::kSmem);
  for_each_grid_chunk(p.batch, [&](int64_t first, unsigned count) {
    a.batch0 = int(first);
    args.a = a;
    const dim3 grid(unsigned(a.m_blocks), unsigned(p.num_heads / a.pack), count);
    LLMK_LAUNCH(kernel, grid, Cfg::kThreads, Cfg::kSmem, stream)(args);
  });
  ++g_launches;
  return true;
}

template bool launch_prefill_sm90<__half, 64>(KernelArgs a, int64_t stream);
template bool launch_prefill_sm90<__nv_bfloat16, 64>(KernelArgs a, int64_t stream);
template bool launch_prefill_sm90<__half, 128>(KernelArgs a, int64_t stream);
template bool launch_prefill_sm90<__nv_bfloat16, 128>(KernelArgs a, int64_t stream);
template bool launch_prefill_sm90<__half, 256>(KernelArgs a, int64_t stream);
template bool launch_prefill_sm90<__nv_bfloat16, 256>(KernelArgs a, int64_t stream);

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
