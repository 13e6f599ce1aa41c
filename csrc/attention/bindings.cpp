#include "common/bindings.h"

namespace llmk {
void bind_attention(pybind11::module_& m) {}
}  // namespace llmk
