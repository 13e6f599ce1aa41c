#include "common/bindings.h"

namespace llmk {
void bind_sampling(pybind11::module_& m) {}
}  // namespace llmk
