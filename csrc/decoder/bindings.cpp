#include "common/bindings.h"
#include "decoder/decode_step.h"

namespace llmk {
namespace {

// (kind, weight, bias or None, in_features, out_features, silu_after, layout) from ops/decoder.py.
using ProjectionArgs = std::tuple<int, TensorView, std::optional<TensorView>, int64_t, int64_t, bool, int64_t>;

Projection projection(const ProjectionArgs& a) {
  return Projection{static_cast<ProjKind>(std::get<0>(a)), std::get<1>(a), std::get<2>(a), std::get<3>(a),
                    std::get<4>(a), std::get<5>(a), std::get<6>(a)};
}

void add_layer(DecodeStepCpu& self, TensorView input_norm, double input_eps, TensorView post_norm, double post_eps,
               std::optional<TensorView> q_norm, std::optional<TensorView> k_norm, double qk_eps,
               const ProjectionArgs& qkv, const ProjectionArgs& o, const ProjectionArgs& gate_up,
               const ProjectionArgs& down) {
  DecoderLayer L{Norm{input_norm, input_eps}, Norm{post_norm, post_eps}, std::nullopt, std::nullopt,
                 projection(qkv), projection(o), projection(gate_up), projection(down)};
  if (q_norm) L.q_norm = Norm{*q_norm, qk_eps};
  if (k_norm) L.k_norm = Norm{*k_norm, qk_eps};
  self.add_layer(L);
}

}  // namespace

void bind_decoder(pybind11::module_& m) {
  // module_local: _C and _simt both bind it, and pybind11 types are global to the interpreter
  // unless local (a process that imports both would otherwise fail on the second import).
  pybind11::class_<DecodeStepCpu>(m, "DecodeStepCpu", pybind11::module_local())
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, TensorView, TensorView, double, int64_t, int64_t>())
      .def("add_layer", &add_layer)
      .def("set_kv_caches", &DecodeStepCpu::set_kv_caches)
      .def("step", &DecodeStepCpu::step, release_gil())
      .def("set_profiling", &DecodeStepCpu::set_profiling)
      .def("profile",  // (steps, rows, [seconds per StepPhase]), read under one lock
           [](DecodeStepCpu& self) {
             DecodeStepCpu::Profile p = self.profile();
             return std::make_tuple(p.steps, p.rows, p.seconds);
           })
      .def_property_readonly("num_layers", &DecodeStepCpu::num_layers);
}
}  // namespace llmk
