// One bind_<family>() per op family; each defines that family's ops with one m.def line per op.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/dlpack_caster.h"

namespace llmk {
// Every kernel binding releases the GIL once its arguments are converted (pybind11 runs the
// call guard around the call only), so other Python threads (a server's event loop) keep running
// while a kernel does. Kernels never touch Python objects.
using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;

void bind_kvcache(pybind11::module_& m);
void bind_attention(pybind11::module_& m);
void bind_sampling(pybind11::module_& m);
void bind_linear(pybind11::module_& m);
void bind_layernorm(pybind11::module_& m);
void bind_rotary(pybind11::module_& m);
void bind_moe(pybind11::module_& m);
void bind_decoder(pybind11::module_& m);
}  // namespace llmk
