#include "common/bindings.h"
#include "rotary/rotary.h"

namespace llmk {
void bind_rotary(pybind11::module_& m) { m.def("rotary_embedding", &rotary_embedding, release_gil()); }
}  // namespace llmk
