#include "common/bindings.h"
#include "sampling/sampling.h"

namespace llmk {
void bind_sampling(pybind11::module_& m) {
  m.def("sample", &sample, release_gil());
  m.def("renorm", &renorm, release_gil());
  m.def("softmax", &softmax, release_gil());
  m.def("chain_speculative_sampling", &chain_speculative_sampling, release_gil());
  m.def("apply_penalties", &apply_penalties, release_gil());
  m.def("apply_token_bitmask_inplace", &apply_token_bitmask_inplace, release_gil());
}
}  // namespace llmk
