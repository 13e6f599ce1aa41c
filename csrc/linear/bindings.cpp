#include "common/bindings.h"
#include "linear/linear.h"
#include "linear/linear_quant.h"

namespace llmk {
void bind_linear(pybind11::module_& m) {
  m.def("linear_small_m", &linear_small_m, release_gil());
  m.def("linear_packed", &linear_packed, release_gil());
  m.def("linear_packed_silu_mul", &linear_packed_silu_mul, release_gil());
  m.def("packed_weight_rows", &packed_weight_rows, release_gil());
  m.def("linear_quant", &linear_quant, release_gil());
  m.def("linear_quant_silu_mul", &linear_quant_silu_mul, release_gil());
  m.def("quant_weight_rows", &quant_weight_rows, release_gil());
}
}  // namespace llmk
