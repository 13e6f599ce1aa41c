#include "attention/flash_attn.h"
#include "attention/sm90_switch.h"
#include "common/bindings.h"

namespace llmk {
void bind_attention(pybind11::module_& m) {
  m.def("flash_attn_varlen_fwd", &flash_attn_varlen_fwd, release_gil());
  m.def("flash_attn_kvcache_fwd", &flash_attn_kvcache_fwd, release_gil());
  m.def("flash_attn_kvcache_fwd_ext", &flash_attn_kvcache_fwd_ext, release_gil());
#if defined(LLMK_SIMT) || defined(LLMK_WITH_CUDA)
  m.def("sm90_prefill_launches", &gpu::attn::sm90_prefill_launches);
  m.def("use_sm90_prefill", &gpu::attn::use_sm90_prefill);
#endif
}
}  // namespace llmk
