#include "common/bindings.h"
#include "moe/moe.h"

namespace llmk {
void bind_moe(pybind11::module_& m) {
  m.def("topk_softmax", &topk_softmax, release_gil());
  m.def("moe_align_block_size", &moe_align_block_size, release_gil());
  m.def("fused_moe", &fused_moe, release_gil());
  m.def("fused_moe_packed", &fused_moe_packed, release_gil());
  m.def("fused_moe_workspace_bytes", &fused_moe_workspace_bytes);
}
}  // namespace llmk
