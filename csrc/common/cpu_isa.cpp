#include <cstdlib>
#include <cstring>

#include "common/dispatch.h"

#if LLMK_MULTI_ISA && (defined(__x86_64__) || defined(_M_X64))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

#if LLMK_MULTI_ISA && LLMK_WITH_AMX && (defined(__x86_64__) || defined(_M_X64))
#include <cstdio>
namespace llmk { namespace cpu_avx512 { bool amx_tiles_agree(); bool amx_int8_tiles_agree(); } }  // common/amx_selftest_cpu.cpp
#endif

namespace llmk {

namespace {

#if LLMK_MULTI_ISA && LLMK_WITH_AMX && (defined(__x86_64__) || defined(_M_X64))
// AMX-TILE and AMX-BF16 in CPUID, and the tile state enabled by the OS (XCR0 bits 17-18).
bool amx_present() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);  // XTILECFG | XTILEDATA
}

bool amx_int8_present() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25));
}

// Only when the AMX level is chosen: Linux's grant of the tile data state to this process
// (arch_prctl ARCH_REQ_XCOMP_PERM; without it the first tile instruction faults; it covers every
// thread), then the tiles checked against their software model.
bool amx_enable() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  if (!cpu_avx512::amx_tiles_agree()) {
    std::fprintf(stderr, "llmkern: the AMX tiles disagree with their software model on this CPU; "
                         "the bf16 kernels stay on AVX-512\n");
    return false;
  }
  return true;
}
// After amx_enable: the int8 tiles checked as the bf16 ones were.
bool amx_int8_enable() {
  if (!amx_int8_present()) return false;
  if (!cpu_avx512::amx_int8_tiles_agree()) {
    std::fprintf(stderr, "llmkern: the AMX-INT8 tiles disagree with their software model on this CPU; "
                         "the quantised kernels stay on AVX-512\n");
    return false;
  }
  return true;
}
#else
bool amx_present() { return false; }
bool amx_enable() { return false; }
bool amx_int8_enable() { return false; }
#endif

// LLMKERN_CPU_ISA: scalar | avx2 | avx512 | amx cap the level; amx-emulated runs the tile kernels
// through their software model (needs the AVX-512 level).
const char* isa_env() {
  const char* env = std::getenv("LLMKERN_CPU_ISA");
  return env && *env ? env : nullptr;
}

bool amx_emulated_requested() {
  const char* env = isa_env();
  return env && std::strcmp(env, "amx-emulated") == 0;
}

}  // namespace

bool amx_compiled() {
#if LLMK_MULTI_ISA && LLMK_WITH_AMX
  return true;
#else
  return false;
#endif
}

CpuIsa cpu_isa_supported() {
#if LLMK_MULTI_ISA && (defined(__x86_64__) || defined(_M_X64))
  static const CpuIsa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return amx_present() ? CpuIsa::Amx : CpuIsa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::Avx2;
    return CpuIsa::Scalar;
  }();
  return best;
#else
  return CpuIsa::Scalar;
#endif
}

CpuIsa cpu_isa() {
  static const CpuIsa chosen = [] {
    const CpuIsa best = cpu_isa_supported();
    const char* env = isa_env();
    if (amx_emulated_requested())
      return amx_compiled() && best >= CpuIsa::Avx512 ? CpuIsa::Amx : best;
    const CpuIsa want = !env                            ? CpuIsa::Amx
                        : std::strcmp(env, "scalar") == 0 ? CpuIsa::Scalar
                        : std::strcmp(env, "avx2") == 0   ? CpuIsa::Avx2
                        : std::strcmp(env, "avx512") == 0 ? CpuIsa::Avx512
                                                          : CpuIsa::Amx;
    const CpuIsa level = want < best ? want : best;
    return level == CpuIsa::Amx && !amx_enable() ? CpuIsa::Avx512 : level;
  }();
  return chosen;
}

AmxMode amx_mode() {
  static const AmxMode mode = [] {
    if (cpu_isa() != CpuIsa::Amx) return AmxMode::Off;
    return amx_emulated_requested() ? AmxMode::Emulated : AmxMode::Hardware;
  }();
  return mode;
}

AmxMode amx_int8_mode() {
  static const AmxMode mode = [] {
    const AmxMode m = amx_mode();
    return m == AmxMode::Hardware && !amx_int8_enable() ? AmxMode::Off : m;
  }();
  return mode;
}

bool cpu_avx512_bf16(const char* env_off) {
#if LLMK_MULTI_ISA && (defined(__x86_64__) || defined(_M_X64))
  const char* env = std::getenv(env_off);
  return __builtin_cpu_supports("avx512bf16") && !(env && env[0] == '0');
#else
  (void)env_off;
  return false;
#endif
}

bool cpu_bf16_cvt() {
  static const bool v = cpu_avx512_bf16("LLMKERN_BF16_CVT");
  return v;
}

bool cpu_bf16_gemv_prefetch() {
  static const bool v = [] {
    const char* env = std::getenv("LLMKERN_GEMV_PREFETCH");
    if (env && env[0]) return env[0] != '0';
#if LLMK_MULTI_ISA && (defined(__x86_64__) || defined(_M_X64))
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;  // CPUID's vendor "GenuineIntel"
#else
    return false;
#endif
  }();
  return v;
}

const char* amx_mode_name(AmxMode mode) {
  switch (mode) {
    case AmxMode::Hardware: return "hardware";
    case AmxMode::Emulated: return "emulated";
    default: return "off";
  }
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Amx: return "amx";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace llmk
