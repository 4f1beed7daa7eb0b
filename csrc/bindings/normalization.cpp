// Bindings of the normalization family. Optional tensors (mu, rsigma, the backward's dresidual)
// are None to skip them.
// The backward takes its workspace as a descriptor; one whose data pointer is 0 asks for the
// size, which the call returns (bytes); a real call returns the same size.
#include "bindings.h"
#include "transformer_engine/normalization.h"

namespace te_py {
namespace {

struct Optional {
  NVTETensor t{};
  bool present = false;
  explicit Optional(const py::object& o) {
    if (!o.is_none()) {
      t = tensor_from_tuple(o.cast<py::tuple>());
      present = true;
    }
  }
  NVTETensor* ptr() { return present ? &t : nullptr; }
};

}  // namespace

void register_normalization(py::module_& m) {
  m.def("layernorm_fwd", [](const py::tuple& x, const py::tuple& gamma, const py::tuple& beta,
                            float eps, bool zero_centered, const py::tuple& z,
                            const py::object& mu, const py::object& rsigma, uintptr_t stream) {
    NVTETensor xd = tensor_from_tuple(x), g = tensor_from_tuple(gamma), b = tensor_from_tuple(beta),
               zd = tensor_from_tuple(z);
    Optional mu_d(mu), rs_d(rsigma);
    check_status(nvte_layernorm_fwd(&xd, &g, &b, eps, zero_centered, &zd, mu_d.ptr(), rs_d.ptr(),
                                    stream_from_int(stream)));
  });
  m.def("rmsnorm_fwd", [](const py::tuple& x, const py::tuple& gamma, float eps,
                          bool zero_centered, const py::tuple& z, const py::object& rsigma,
                          uintptr_t stream) {
    NVTETensor xd = tensor_from_tuple(x), g = tensor_from_tuple(gamma), zd = tensor_from_tuple(z);
    Optional rs_d(rsigma);
    check_status(nvte_rmsnorm_fwd(&xd, &g, eps, zero_centered, &zd, rs_d.ptr(),
                                  stream_from_int(stream)));
  });
  m.def("layernorm_bwd", [](const py::tuple& dz, const py::tuple& x, const py::tuple& mu,
                            const py::tuple& rsigma, const py::tuple& gamma, bool zero_centered,
                            const py::tuple& dx, const py::tuple& dgamma, const py::tuple& dbeta,
                            const py::tuple& workspace, const py::object& dresidual,
                            uintptr_t stream) {
    NVTETensor dzd = tensor_from_tuple(dz), xd = tensor_from_tuple(x), mud = tensor_from_tuple(mu),
               rsd = tensor_from_tuple(rsigma), g = tensor_from_tuple(gamma),
               dxd = tensor_from_tuple(dx), dg = tensor_from_tuple(dgamma),
               db = tensor_from_tuple(dbeta), ws = tensor_from_tuple(workspace);
    Optional dres(dresidual);
    check_status(dres.present
                     ? nvte_layernorm_bwd_residual(&dzd, &xd, &mud, &rsd, &g, zero_centered,
                                                   dres.ptr(), &dxd, &dg, &db, &ws,
                                                   stream_from_int(stream))
                     : nvte_layernorm_bwd(&dzd, &xd, &mud, &rsd, &g, zero_centered, &dxd, &dg,
                                          &db, &ws, stream_from_int(stream)));
    return ws.ndim >= 1 ? ws.shape[0] : int64_t(0);
  });
  m.def("rmsnorm_bwd", [](const py::tuple& dz, const py::tuple& x, const py::tuple& rsigma,
                          const py::tuple& gamma, bool zero_centered, const py::tuple& dx,
                          const py::tuple& dgamma, const py::tuple& workspace,
                          const py::object& dresidual, uintptr_t stream) {
    NVTETensor dzd = tensor_from_tuple(dz), xd = tensor_from_tuple(x),
               rsd = tensor_from_tuple(rsigma), g = tensor_from_tuple(gamma),
               dxd = tensor_from_tuple(dx), dg = tensor_from_tuple(dgamma),
               ws = tensor_from_tuple(workspace);
    Optional dres(dresidual);
    check_status(dres.present
                     ? nvte_rmsnorm_bwd_residual(&dzd, &xd, &rsd, &g, zero_centered, dres.ptr(),
                                                 &dxd, &dg, &ws, stream_from_int(stream))
                     : nvte_rmsnorm_bwd(&dzd, &xd, &rsd, &g, zero_centered, &dxd, &dg, &ws,
                                        stream_from_int(stream)));
    return ws.ndim >= 1 ? ws.shape[0] : int64_t(0);
  });
}

}  // namespace te_py
