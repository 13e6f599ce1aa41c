// Launcher of the decode-shaped kernel (flash_decode.cuh) for one (dtype, padded head dim).
#pragma once
#include "attention/flash_decode.cuh"
#include "attention/flash_launch.h"

namespace llmk {
namespace gpu {
namespace attn {

template <typename T, int kD>
struct DecodeTuning {  // fp16 / bf16: tensor cores; deeper pipeline where tiles are small
  using Tile = MmaTile<T, kD>;
  // hd256: one stage per warp (~82 KiB per CTA, 2 CTAs per SM: as many tiles in flight per SM as
  // 2 stages in one CTA, with twice the warps to hide latency).
  static constexpr int kStages = kD <= 64 ? 3 : kD <= 128 ? 2 : 1;
};
template <int kD>
struct DecodeTuning<float, kD> {
  using Tile = FmaTile<kD>;
  static constexpr int kStages = 2;
};

template <typename T, int kD>
void launch_decode(KernelArgs a, int64_t stream) {
  using Tn = DecodeTuning<T, kD>;
  using Cfg = DecodeCfg<typename Tn::Tile, Tn::kStages>;
  const AttnParams& p = a.p;
  a.pack = a.group;
  a.m_blocks = (p.max_seqlen_q * a.group + kDecodeRows - 1) / kDecodeRows;
  auto flash_decode = &flash_decode_kernel<T, typename Tn::Tile, Tn::kStages>;
  allow_dynamic_smem(flash_decode, Cfg::kSmem);
  for_each_grid_chunk(p.batch, [&](int64_t first, unsigned count) {
    a.batch0 = int(first);
    const dim3 grid(unsigned(a.m_blocks * a.num_splits), unsigned(p.num_kv_heads), count);
    LLMK_LAUNCH(flash_decode, grid, Cfg::kThreads, Cfg::kSmem, stream)(a);
  });
}

}  // namespace attn
}  // namespace gpu
}  // namespace llmk
