// Which instructions each CPU kernel family runs on in this process: the SIMD level's objects, and
// inside them the extensions each family checks on its own (AMX tiles, AVX512_BF16, AVX512_VNNI)
// with their test switches applied. build_info()["cpu_kernels"] reports it, and the benchmark
// reports print it beside every figure, so figures from different paths are never mixed.
#include <string>
#include <utility>
#include <vector>

#include "common/dispatch.h"
#include "common/macros.h"
#include "linear/gemm_bf16_amx_cpu.h"

LLMK_NS_BEGIN

namespace gemm {
bool bf16_dot();           // linear_cpu.cpp
}
namespace attn {
bool cpu_bf16_dot();       // attention/flash_attn_tiles_cpu.cpp
}
bool linear_quant_vnni();  // linear/linear_quant_cpu.cpp
int64_t linear_quant_amx_rows();

std::vector<std::pair<std::string, std::string>> kernel_paths() {
#if defined(__AVX512F__)
  const std::string isa = "avx512";
#elif defined(__AVX2__)
  const std::string isa = "avx2";
#else
  const std::string isa = "scalar";
#endif
  const std::string widened = isa + " (bf16 widened to fp32)";
  std::string linear_bf16 = gemm::bf16_dot() ? "avx512-bf16" : widened;
  std::string attention_bf16 = attn::cpu_bf16_dot() ? "avx512-bf16" : widened;
  std::string linear_quant = linear_quant_vnni() ? "avx512-vnni" : isa;
#if LLMK_AMX_TILES
  const AmxMode amx = amx_mode();
  if (amx != AmxMode::Off) {
    const std::string tiles = amx == AmxMode::Emulated ? "amx-bf16 emulated" : "amx-bf16";
    linear_bf16 = tiles + " from " + std::to_string(gemm::kAmxMinRows) + " rows, " + linear_bf16 + " below";
    attention_bf16 = tiles + " for prefill (head_dim a multiple of 32), " + attention_bf16 + " for decode";
  }
  if (const int64_t rows = linear_quant_amx_rows()) {
    const std::string tiles = amx_int8_mode() == AmxMode::Emulated ? "amx-int8 emulated" : "amx-int8";
    linear_quant = tiles + " from " + std::to_string(rows) + " rows (8-bit block-32 layout), " + linear_quant + " below";
  }
#endif
  return {
      {"linear fp32", isa},
      {"linear bf16", linear_bf16},
      {"linear quantised", linear_quant},
      {"attention fp32", isa},
      {"attention bf16", attention_bf16},
      {"moe fp32", isa},
      {"moe bf16", linear_bf16},  // bf16 experts run the bf16 GEMM
      {"sampling", isa},
      {"norms, rotary, kv cache", isa},
  };
}

LLMK_NS_END
