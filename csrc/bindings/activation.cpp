// Bindings of the activation family. Activations are passed as their NVTEActivation code.
#include "bindings.h"
#include "transformer_engine/activation.h"

namespace te_py {

namespace {
NVTEActivation act_of(int code) { return static_cast<NVTEActivation>(code); }
}  // namespace

void register_activation(py::module_& m) {
  m.def("activation", [](int act, const py::tuple& in, const py::tuple& out, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_activation(act_of(act), &i, &o, stream_from_int(stream)));
  });
  m.def("dactivation", [](int act, const py::tuple& grad, const py::tuple& in,
                          const py::tuple& out, uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_dactivation(act_of(act), &g, &i, &o, stream_from_int(stream)));
  });
  m.def("gated_activation", [](int act, const py::tuple& in, const py::tuple& out,
                               uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_gated_activation(act_of(act), &i, &o, stream_from_int(stream)));
  });
  m.def("dgated_activation", [](int act, const py::tuple& grad, const py::tuple& in,
                                const py::tuple& out, uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_dgated_activation(act_of(act), &g, &i, &o, stream_from_int(stream)));
  });
  // Clamped SwiGLU: the gated activation with its parameters (limit, alpha).
  m.def("clamped_swiglu", [](const py::tuple& in, const py::tuple& out, float limit, float alpha,
                             uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_clamped_swiglu(&i, &o, limit, alpha, stream_from_int(stream)));
  });
  m.def("clamped_dswiglu", [](const py::tuple& grad, const py::tuple& in, const py::tuple& out,
                              float limit, float alpha, uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_clamped_dswiglu(&g, &i, &o, limit, alpha, stream_from_int(stream)));
  });
  // Workspace shape of dbias_dactivation (the size query of the C API): a tuple, () if none.
  m.def("dbias_dactivation_workspace", [](int act, const py::tuple& grad, const py::tuple& in,
                                          const py::tuple& out, const py::tuple& dbias) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out),
               b = tensor_from_tuple(dbias);
    NVTETensor ws{};
    ws.ndim = 0;
    check_status(nvte_dbias_dactivation(act_of(act), &g, &i, &o, &b, &ws, nullptr));
    py::tuple shape(ws.ndim);
    for (int k = 0; k < ws.ndim; ++k) shape[k] = ws.shape[k];
    return shape;
  });
  m.def("dbias_dactivation", [](int act, const py::tuple& grad, const py::tuple& in,
                                const py::tuple& out, const py::tuple& dbias,
                                const py::tuple& workspace, uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out),
               b = tensor_from_tuple(dbias), w = tensor_from_tuple(workspace);
    check_status(nvte_dbias_dactivation(act_of(act), &g, &i, &o, &b, &w, stream_from_int(stream)));
  });
  // The plain bias gradient (column sums of a 2-D grad): the workspace shape, then the call.
  m.def("dbias_workspace", [](const py::tuple& grad, const py::tuple& dbias) {
    NVTETensor g = tensor_from_tuple(grad), b = tensor_from_tuple(dbias);
    NVTETensor ws{};
    ws.ndim = 0;
    check_status(nvte_dbias(&g, &b, &ws, nullptr));
    py::tuple shape(ws.ndim);
    for (int k = 0; k < ws.ndim; ++k) shape[k] = ws.shape[k];
    return shape;
  });
  m.def("dbias", [](const py::tuple& grad, const py::tuple& dbias, const py::tuple& workspace,
                    uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), b = tensor_from_tuple(dbias),
               w = tensor_from_tuple(workspace);
    check_status(nvte_dbias(&g, &b, &w, stream_from_int(stream)));
  });
}

}  // namespace te_py
