// Tile shapes of the tensor-core prefill kernel per padded head dim, and its launcher.
#pragma once
#include "attention/flash_launch.h"
#include "attention/flash_prefill.cuh"

namespace llmk {
namespace gpu {
namespace attn {

template <int kD>
struct PrefillTuning;
// hd <= 64: 4 warps x 32 rows, Q in registers; 48 KiB of shared memory.
template <>
struct PrefillTuning<64> { using Cfg = PrefillCfg<64, 128, 64, 4, true>; };
// hd <= 128: 4 warps x 32 rows; Q fragments re-read from shared memory each k-step (keeping
// them in registers as well would exceed the register file with two m16 tiles); 96 KiB.
template <>
struct PrefillTuning<128> { using Cfg = PrefillCfg<128, 128, 64, 4, false>; };
// hd <= 256: 4 warps x 16 rows, 32-key tiles; 96 KiB.
template <>
struct PrefillTuning<256> { using Cfg = PrefillCfg<256, 64, 32, 4, false>; };

template <typename T, typename Cfg, bool kPaged>
auto prefill_kernel_for(ScoreMode m) {
  return m == kScoresFolded    ? &flash_prefill_kernel<T, Cfg, kPaged, kScoresFolded>
         : m == kScoresSoftcap ? &flash_prefill_kernel<T, Cfg, kPaged, kScoresSoftcap>
                               : &flash_prefill_kernel<T, Cfg, kPaged, kScoresAlibi>;
}

template <typename T, int kD>
void launch_prefill(KernelArgs a, int64_t stream) {
  using Cfg = typename PrefillTuning<kD>::Cfg;
  static_assert(Cfg::kBlockM == prefill_block_m(kD), "prefill_block_m out of date");
  const AttnParams& p = a.p;
  a.m_blocks = (p.max_seqlen_q * a.pack + Cfg::kBlockM - 1) / Cfg::kBlockM;
  auto flash_prefill = p.block_table ? prefill_kernel_for<T, Cfg, true>(score_mode(p))
                                     : prefill_kernel_for<T, Cfg, false>(score_mode(p));
  allow_dynamic_smem(flash_prefill, Cfg::kSmem);
  for_each_grid_chunk(p.batch, [&](int64_t first, unsigned count) {
    a.batch0 = int(first);
    const dim3 grid(unsigned(a.m_blocks * a.num_splits), unsigned(p.num_heads / a.pack), count);
    LLMK_LAUNCH(flash_prefill, grid, Cfg::kThreads, Cfg::kSmem, stream)(a);
  });
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
