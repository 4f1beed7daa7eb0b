// Bindings of the GEMM family: one call mirrors nvte_gemm (c None) or nvte_gemm_with_c; bias and
// aux are None when unused, and so is c (the addend; None: C is D). c comes last, with a default,
// so that calls written for nvte_gemm's argument list keep working.
#include "bindings.h"
#include "transformer_engine/gemm.h"

namespace te_py {

void register_gemm(py::module_& m) {
  m.def(
      "gemm",
      [](const py::tuple& a, bool transa, const py::tuple& b, bool transb, const py::tuple& d,
         const py::object& bias, const py::object& aux, int epilogue, float alpha, float beta,
         bool use_fast_accum, uintptr_t workspace, size_t workspace_size, uintptr_t stream,
         const py::object& c) {
        NVTETensor ta = tensor_from_tuple(a), tb = tensor_from_tuple(b), td = tensor_from_tuple(d);
        NVTETensor tbias{}, taux{}, tc{};
        const bool has_bias = !bias.is_none(), has_aux = !aux.is_none(), has_c = !c.is_none();
        if (has_bias) tbias = tensor_from_tuple(bias.cast<py::tuple>());
        if (has_aux) taux = tensor_from_tuple(aux.cast<py::tuple>());
        if (has_c) tc = tensor_from_tuple(c.cast<py::tuple>());
        NVTETensor* pbias = has_bias ? &tbias : nullptr;
        NVTETensor* paux = has_aux ? &taux : nullptr;
        const auto epi = static_cast<NVTEGemmEpilogue>(epilogue);
        void* ws = reinterpret_cast<void*>(workspace);
        // without c: nvte_gemm itself (the same implementation), so its errors keep its name
        if (has_c)
          check_status(nvte_gemm_with_c(&ta, transa, &tb, transb, &tc, &td, pbias, paux, epi,
                                        alpha, beta, use_fast_accum, ws, workspace_size,
                                        stream_from_int(stream)));
        else
          check_status(nvte_gemm(&ta, transa, &tb, transb, &td, pbias, paux, epi, alpha, beta,
                                 use_fast_accum, ws, workspace_size, stream_from_int(stream)));
      },
      py::arg("a"), py::arg("transa"), py::arg("b"), py::arg("transb"), py::arg("d"),
      py::arg("bias"), py::arg("aux"), py::arg("epilogue"), py::arg("alpha"), py::arg("beta"),
      py::arg("use_fast_accum"), py::arg("workspace"), py::arg("workspace_size"),
      py::arg("stream"), py::arg("c") = py::none());
  // nvte_gemm_block_scaled: a_mode / b_mode are NVTEGemmScaleMode codes; bias None when unused.
  m.def("gemm_block_scaled", [](const py::tuple& a, int a_mode, const py::tuple& b, int b_mode,
                                const py::tuple& d, const py::object& bias, uintptr_t workspace,
                                size_t workspace_size, uintptr_t stream) {
    NVTETensor ta = tensor_from_tuple(a), tb = tensor_from_tuple(b), td = tensor_from_tuple(d);
    NVTETensor tbias{};
    if (!bias.is_none()) tbias = tensor_from_tuple(bias.cast<py::tuple>());
    check_status(nvte_gemm_block_scaled(
        &ta, static_cast<NVTEGemmScaleMode>(a_mode), &tb, static_cast<NVTEGemmScaleMode>(b_mode),
        &td, bias.is_none() ? nullptr : &tbias, reinterpret_cast<void*>(workspace),
        workspace_size, stream_from_int(stream)));
  });
  m.def("gemm_workspace_size", [] { return nvte_gemm_workspace_size(); });
}

}  // namespace te_py
