#include "common/bindings.h"
#include "layernorm/layernorm.h"

namespace llmk {
void bind_layernorm(pybind11::module_& m) {
  m.def("rms_norm", &rms_norm);
  m.def("fused_add_rms_norm", &fused_add_rms_norm);
  m.def("silu_and_mul", &silu_and_mul);
}
}  // namespace llmk
