// Bindings of the fused softmax family.
#include "bindings.h"
#include "transformer_engine/softmax.h"

namespace te_py {

void register_softmax(py::module_& m) {
  m.def("scaled_softmax_forward", [](const py::tuple& x, const py::tuple& y, float scale,
                                     uintptr_t stream) {
    NVTETensor xd = tensor_from_tuple(x), yd = tensor_from_tuple(y);
    check_status(nvte_scaled_softmax_forward(&xd, &yd, scale, stream_from_int(stream)));
  });
  m.def("scaled_masked_softmax_forward", [](const py::tuple& x, const py::tuple& mask,
                                            const py::tuple& y, float scale, uintptr_t stream) {
    NVTETensor xd = tensor_from_tuple(x), md = tensor_from_tuple(mask), yd = tensor_from_tuple(y);
    check_status(nvte_scaled_masked_softmax_forward(&xd, &md, &yd, scale, stream_from_int(stream)));
  });
  m.def("scaled_upper_triang_masked_softmax_forward", [](const py::tuple& x, const py::tuple& y,
                                                         float scale, uintptr_t stream) {
    NVTETensor xd = tensor_from_tuple(x), yd = tensor_from_tuple(y);
    check_status(nvte_scaled_upper_triang_masked_softmax_forward(&xd, &yd, scale,
                                                                 stream_from_int(stream)));
  });
  // kind: 0 plain, 1 masked, 2 upper-triangular (causal).
  m.def("scaled_softmax_backward", [](const py::tuple& dy, const py::tuple& y, const py::tuple& dx,
                                      float scale, int kind, uintptr_t stream) {
    NVTETensor dyd = tensor_from_tuple(dy), yd = tensor_from_tuple(y), dxd = tensor_from_tuple(dx);
    NVTEStream s = stream_from_int(stream);
    switch (kind) {
      case 0: check_status(nvte_scaled_softmax_backward(&dyd, &yd, &dxd, scale, s)); break;
      case 1: check_status(nvte_scaled_masked_softmax_backward(&dyd, &yd, &dxd, scale, s)); break;
      case 2:
        check_status(nvte_scaled_upper_triang_masked_softmax_backward(&dyd, &yd, &dxd, scale, s));
        break;
      default: throw py::value_error("scaled_softmax_backward: kind must be 0, 1 or 2");
    }
  });
}

}  // namespace te_py
