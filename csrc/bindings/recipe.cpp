#include <vector>

#include "bindings.h"
#include "transformer_engine/recipe.h"

namespace te_py {

std::vector<NVTEScalingGroup> scaling_groups_from_list(const py::list& groups) {
  std::vector<NVTEScalingGroup> g;
  g.reserve(groups.size());
  for (const auto& item : groups) {
    const py::tuple t = item.cast<py::tuple>();
    if (t.size() != 6 && t.size() != 7)
      throw py::value_error("scaling group must have 6 or 7 items");
    NVTEScalingGroup s{};
    s.amax_history = reinterpret_cast<float*>(t[0].cast<uintptr_t>());
    s.scale = reinterpret_cast<float*>(t[1].cast<uintptr_t>());
    s.scale_inv = reinterpret_cast<float*>(t[2].cast<uintptr_t>());
    s.history_len = t[3].cast<int64_t>();
    s.num_tensors = t[4].cast<int64_t>();
    s.fp8_max = t[5].cast<float>();
    // optional: the int32 [num_tensors] counter of updates skipped for a non-finite amax
    if (t.size() == 7) s.skipped = reinterpret_cast<int32_t*>(t[6].cast<uintptr_t>());
    g.push_back(s);
  }
  return g;
}

void delayed_scaling_update_from_list(const py::list& groups, int algo, float margin,
                                      NVTEStream stream) {
  const std::vector<NVTEScalingGroup> g = scaling_groups_from_list(groups);
  check_status(nvte_delayed_scaling_update(g.data(), static_cast<int64_t>(g.size()),
                                           static_cast<NVTEAmaxAlgo>(algo), margin, stream));
}

void register_recipe(py::module_& m) {
  // groups: list of (history_ptr, scale_ptr, scale_inv_ptr, history_len, num_tensors, fp8_max
  // [, skipped_ptr])
  m.def("delayed_scaling_update", [](const py::list& groups, int algo, float margin,
                                     uintptr_t stream) {
    delayed_scaling_update_from_list(groups, algo, margin, stream_from_int(stream));
  });
  // Current scaling of the tensors described by `inputs` (a list of descriptor tuples) into
  // scale[i] / scale_inv[i], with amax [n] and counter as zeroed scratch (see recipe.h); skipped
  // (int32 [n], 0: not counted) counts the tensors whose amax was not finite.
  m.def(
      "current_scaling_scales",
      [](const py::list& inputs, uintptr_t amax, uintptr_t counter, uintptr_t scale,
         uintptr_t scale_inv, float fp8_max, uintptr_t stream, uintptr_t skipped) {
        std::vector<NVTETensor> t;
        t.reserve(inputs.size());
        for (const auto& item : inputs) t.push_back(tensor_from_tuple(item.cast<py::tuple>()));
        std::vector<const NVTETensor*> p;
        for (const auto& d : t) p.push_back(&d);
        check_status(nvte_current_scaling_scales(
            p.data(), static_cast<int64_t>(p.size()), reinterpret_cast<float*>(amax),
            reinterpret_cast<int*>(counter), reinterpret_cast<float*>(scale),
            reinterpret_cast<float*>(scale_inv), reinterpret_cast<int*>(skipped), fp8_max,
            stream_from_int(stream)));
      },
      py::arg("inputs"), py::arg("amax"), py::arg("counter"), py::arg("scale"),
      py::arg("scale_inv"), py::arg("fp8_max"), py::arg("stream"), py::arg("skipped") = 0);
}

}  // namespace te_py
