// One bind_<family>() per op family; each defines that family's ops with one m.def line per op.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/dlpack_caster.h"

namespace llmk {
void bind_kvcache(pybind11::module_& m);
void bind_attention(pybind11::module_& m);
void bind_sampling(pybind11::module_& m);
void bind_linear(pybind11::module_& m);
void bind_layernorm(pybind11::module_& m);
void bind_rotary(pybind11::module_& m);
}  // namespace llmk
