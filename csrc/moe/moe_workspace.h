// The CUDA fused_moe's intermediates, carved from one caller-allocated byte buffer (ops never
// allocate device memory behind the caller, so CUDA graphs can capture them).
#pragma once
#include <cstdint>

namespace llmk {
namespace moe {

constexpr int kBlockM = 16;  // rows of a grouped-GEMM tile: each expert's pair group is padded to it

struct Workspace {
  int64_t n_sorted, n_blocks;                       // entries of sorted ids / block experts
  int64_t sorted, blocks, npad, act, y, total;      // byte offsets (16-byte aligned), total size

  // pairs = num_tokens * topk; act [n_sorted, I] in the input dtype (the down GEMM's A operand),
  // y [pairs, H] fp32 (each pair's expert output, summed in token order at the end).
  static Workspace layout(int64_t pairs, int64_t E, int64_t H, int64_t I, int64_t elem_bytes) {
    auto up = [](int64_t b) { return (b + 15) / 16 * 16; };
    Workspace w{};
    w.n_sorted = pairs + E * (kBlockM - 1);
    w.n_blocks = (w.n_sorted + kBlockM - 1) / kBlockM;
    w.sorted = 0;
    w.blocks = up(w.sorted + w.n_sorted * 4);
    w.npad = up(w.blocks + w.n_blocks * 4);
    w.act = up(w.npad + 4);
    w.y = up(w.act + w.n_sorted * I * elem_bytes);
    w.total = up(w.y + pairs * H * 4);
    return w;
  }
};

}  // namespace moe
}  // namespace llmk
