#include "attention/flash_attn.h"
#include "common/bindings.h"

namespace llmk {
void bind_attention(pybind11::module_& m) {
  m.def("flash_attn_varlen_fwd", &flash_attn_varlen_fwd);
  m.def("flash_attn_kvcache_fwd", &flash_attn_kvcache_fwd);
  m.def("flash_attn_kvcache_fwd_ext", &flash_attn_kvcache_fwd_ext);
}
}  // namespace llmk
