#include "attention/flash_attn.h"
#include "common/bindings.h"

namespace llmk {
void bind_attention(pybind11::module_& m) {
  m.def("flash_attn_varlen_fwd", &flash_attn_varlen_fwd, release_gil());
  m.def("flash_attn_kvcache_fwd", &flash_attn_kvcache_fwd, release_gil());
  m.def("flash_attn_kvcache_fwd_ext", &flash_attn_kvcache_fwd_ext, release_gil());
}
}  // namespace llmk
