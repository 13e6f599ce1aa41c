#include "common/bindings.h"
#include "sampling/sampling.h"

namespace llmk {
void bind_sampling(pybind11::module_& m) {
  m.def("sample", &sample);
  m.def("renorm", &renorm);
  m.def("softmax", &softmax);
  m.def("chain_speculative_sampling", &chain_speculative_sampling);
  m.def("apply_penalties", &apply_penalties);
}
}  // namespace llmk
