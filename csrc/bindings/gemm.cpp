// Bindings of the GEMM family: one call mirrors nvte_gemm; bias and aux are None when unused.
#include "bindings.h"
#include "transformer_engine/gemm.h"

namespace te_py {

void register_gemm(py::module_& m) {
  m.def("gemm", [](const py::tuple& a, bool transa, const py::tuple& b, bool transb,
                   const py::tuple& d, const py::object& bias, const py::object& aux, int epilogue,
                   float alpha, float beta, bool use_fast_accum, uintptr_t workspace,
                   size_t workspace_size, uintptr_t stream) {
    NVTETensor ta = tensor_from_tuple(a), tb = tensor_from_tuple(b), td = tensor_from_tuple(d);
    NVTETensor tbias{}, taux{};
    const bool has_bias = !bias.is_none(), has_aux = !aux.is_none();
    if (has_bias) tbias = tensor_from_tuple(bias.cast<py::tuple>());
    if (has_aux) taux = tensor_from_tuple(aux.cast<py::tuple>());
    check_status(nvte_gemm(&ta, transa, &tb, transb, &td, has_bias ? &tbias : nullptr,
                           has_aux ? &taux : nullptr, static_cast<NVTEGemmEpilogue>(epilogue),
                           alpha, beta, use_fast_accum, reinterpret_cast<void*>(workspace),
                           workspace_size, stream_from_int(stream)));
  });
  m.def("gemm_workspace_size", [] { return nvte_gemm_workspace_size(); });
}

}  // namespace te_py
