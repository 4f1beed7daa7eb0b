// Bindings of the cast and transpose families.
#include "bindings.h"
#include "transformer_engine/cast.h"
#include "transformer_engine/transpose.h"

namespace te_py {

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
  m.def("transpose", [](const py::tuple& in, const py::tuple& out, uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out);
    check_status(nvte_transpose(&i, &o, stream_from_int(stream)));
  });
  m.def("cast_transpose", [](const py::tuple& in, const py::tuple& out, const py::tuple& out_t,
                             uintptr_t stream) {
    NVTETensor i = tensor_from_tuple(in), o = tensor_from_tuple(out), t = tensor_from_tuple(out_t);
    check_status(nvte_cast_transpose(&i, &o, &t, stream_from_int(stream)));
  });
}

}  // namespace te_py
