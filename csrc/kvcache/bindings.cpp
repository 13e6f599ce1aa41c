#include "common/bindings.h"
#include "kvcache/cache_ops.h"

namespace llmk {
void bind_kvcache(pybind11::module_& m) {
  m.def("reshape_and_cache_flash", &reshape_and_cache_flash, release_gil());
  m.def("copy_blocks", &copy_blocks, release_gil());
  m.def("swap_blocks", &swap_blocks, release_gil());
}
}  // namespace llmk
