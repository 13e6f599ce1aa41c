#include "common/bindings.h"
#include "linear/linear.h"

namespace llmk {
void bind_linear(pybind11::module_& m) {
  m.def("linear_small_m", &linear_small_m);
  m.def("linear_packed", &linear_packed);
}
}  // namespace llmk
