// Bindings of the cast and transpose families.
#include "bindings.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/transpose.h"

namespace te_py {

namespace {
py::tuple shape_of(const NVTETensor& t) {
  py::tuple shape(t.ndim);
  for (int k = 0; k < t.ndim; ++k) shape[k] = t.shape[k];
  return shape;
}
}  // namespace

void register_cast(py::module_& m) {
  m.def("quantize", [](const py::tuple& in, const py::tuple& out, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_quantize(&i, &o, stream_from_int(stream)));
  });
  m.def("dequantize", [](const py::tuple& in, const py::tuple& out, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_dequantize(&i, &o, stream_from_int(stream)));
  });
  m.def("compute_amax", [](const py::tuple& in, uintptr_t amax, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in);
    check_status(nvte_compute_amax(&i, reinterpret_cast<float*>(amax), stream_from_int(stream)));
  });
  // out_t None: no transposed output. block_dim 1 (1x128) or 2 (128x128).
  m.def("quantize_blockwise", [](const py::tuple& in, const py::tuple& out, const py::object& out_t,
                                 int block_dim, bool pow2_scales, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t{};
    if (!out_t.is_none()) t = tensor_from_tuple(out_t.cast<py::tuple>());
    check_status(nvte_quantize_blockwise(&i, &o, out_t.is_none() ? nullptr : &t, block_dim,
                                         pow2_scales, stream_from_int(stream)));
  });
  m.def("transpose", [](const py::tuple& in, const py::tuple& out, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_transpose(&i, &o, stream_from_int(stream)));
  });
  m.def("cast_transpose", [](const py::tuple& in, const py::tuple& out, const py::tuple& out_t,
                             uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t);
    check_status(nvte_cast_transpose(&i, &o, &t, stream_from_int(stream)));
  });
  m.def("cast_transpose_rows", [](const py::tuple& in, const py::tuple& out,
                                  const py::tuple& out_t, int64_t row_begin, int64_t row_end,
                                  uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t);
    check_status(nvte_cast_transpose_rows(&i, &o, &t, row_begin, row_end, stream_from_int(stream)));
  });

  // Fused cast+transpose ops. The dbias forms take their fp32 workspace from the caller: the
  // *_workspace functions run the C API's size query and return its shape, () if none is needed.
  m.def("cast_transpose_dbias_workspace", [](const py::tuple& in, const py::tuple& out,
                                             const py::tuple& out_t, const py::tuple& dbias) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t),
               b = tensor_from_tuple(dbias);
    NVTETensor ws{};
    check_status(nvte_cast_transpose_dbias(&i, &o, &t, &b, &ws, nullptr));
    return shape_of(ws);
  });
  m.def("cast_transpose_dbias", [](const py::tuple& in, const py::tuple& out,
                                   const py::tuple& out_t, const py::tuple& dbias,
                                   const py::tuple& workspace, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t),
               b = tensor_from_tuple(dbias), w = tensor_from_tuple(workspace);
    check_status(nvte_cast_transpose_dbias(&i, &o, &t, &b, &w, stream_from_int(stream)));
  });
  // act: the NVTEActivation code; gated: the [rows, 2N] -> [rows, N] form.
  m.def("act_cast_transpose", [](int act, bool gated, const py::tuple& in, const py::tuple& out,
                                 const py::tuple& out_t, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t);
    const auto fn = gated ? nvte_gated_act_cast_transpose : nvte_act_cast_transpose;
    check_status(fn(static_cast<NVTEActivation>(act), &i, &o, &t, stream_from_int(stream)));
  });
  m.def("dact_dbias_cast_transpose_workspace",
        [](int act, bool gated, const py::tuple& grad, const py::tuple& in, const py::tuple& out,
           const py::tuple& out_t, const py::tuple& dbias) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out),
               t = tensor_from_tuple(out_t), b = tensor_from_tuple(dbias);
    NVTETensor ws{};
    const auto fn = gated ? nvte_dgated_act_dbias_cast_transpose : nvte_dact_dbias_cast_transpose;
    check_status(fn(static_cast<NVTEActivation>(act), &g, &i, &o, &t, &b, &ws, nullptr));
    return shape_of(ws);
  });
  // dbias and workspace are None for the form without a bias gradient.
  m.def("dact_dbias_cast_transpose",
        [](int act, bool gated, const py::tuple& grad, const py::tuple& in, const py::tuple& out,
           const py::tuple& out_t, const py::object& dbias, const py::object& workspace,
           uintptr_t stream) {
    NVTETensor g = tensor_from_tuple(grad), i = tensor_from_tuple(in), o = tensor_from_tuple(out),
               t = tensor_from_tuple(out_t), b{}, w{};
    const bool with_dbias = !dbias.is_none();
    if (with_dbias) {
      b = tensor_from_tuple(dbias.cast<py::tuple>());
      w = tensor_from_tuple(workspace.cast<py::tuple>());
    }
    const auto fn = gated ? nvte_dgated_act_dbias_cast_transpose : nvte_dact_dbias_cast_transpose;
    check_status(fn(static_cast<NVTEActivation>(act), &g, &i, &o, &t, with_dbias ? &b : nullptr,
                    with_dbias ? &w : nullptr, stream_from_int(stream)));
  });
}

}  // namespace te_py
