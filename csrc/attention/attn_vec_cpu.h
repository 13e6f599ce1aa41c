// The attention kernels' name for the CPU numeric library (common/vec_cpu.h).
#pragma once
#include "common/vec_cpu.h"

LLMK_NS_BEGIN
namespace attn {
using namespace vec;  // NOLINT: attn::VL, attn::load<T>, ... as before the library moved
}  // namespace attn
LLMK_NS_END
