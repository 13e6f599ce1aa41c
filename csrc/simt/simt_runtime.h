// Emulator-side declarations shared by the SIMT runtime and its Python bindings (llmkern._simt).
#pragma once
#include <cstddef>
#include <cstdint>

namespace llmk {
namespace simt {
namespace emu {

constexpr size_t kDefaultDynamicSmem = 48 * 1024;  // CUDA's limit without an opt-in
constexpr int kMaxDynamicSmem = 227 * 1024;        // sm_90's opt-in maximum per block

struct Stats {  // cumulative counters since the module was loaded
  uint64_t launches = 0, blocks = 0, switches = 0, barriers = 0, collectives = 0;
};
Stats stats();

}  // namespace emu
}  // namespace simt
}  // namespace llmk
