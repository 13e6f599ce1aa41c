#include "common/bindings.h"
#include "layernorm/layernorm.h"

namespace llmk {
void bind_layernorm(pybind11::module_& m) {
  m.def("rms_norm", &rms_norm, release_gil());
  m.def("fused_add_rms_norm", &fused_add_rms_norm, release_gil());
  m.def("silu_and_mul", &silu_and_mul, release_gil());
}
}  // namespace llmk
