#include <cstdlib>
#include <cstring>

#include "common/dispatch.h"

namespace llmk {

CpuIsa cpu_isa_supported() {
#if LLMK_MULTI_ISA && (defined(__x86_64__) || defined(_M_X64))
  static const CpuIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return CpuIsa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::Avx2;
    return CpuIsa::Scalar;
  }();
  return best;
#else
  return CpuIsa::Scalar;
#endif
}

CpuIsa cpu_isa() {
  // LLMKERN_CPU_ISA=scalar|avx2|avx512 caps the level (for testing each path on one machine).
  static const CpuIsa chosen = [] {
    CpuIsa best = cpu_isa_supported();
    const char* env = std::getenv("LLMKERN_CPU_ISA");
    if (!env || !*env) return best;
    CpuIsa want = std::strcmp(env, "scalar") == 0 ? CpuIsa::Scalar
                  : std::strcmp(env, "avx2") == 0 ? CpuIsa::Avx2
                                                   : CpuIsa::Avx512;
    return static_cast<int>(want) < static_cast<int>(best) ? want : best;
  }();
  return chosen;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace llmk
