#include <vector>

#include "bindings.h"
#include "transformer_engine/recipe.h"

namespace te_py {

void register_recipe(py::module_& m) {
  // groups: list of (history_ptr, scale_ptr, scale_inv_ptr, history_len, num_tensors, fp8_max)
  m.def("delayed_scaling_update", [](const py::list& groups, int algo, float margin,
                                     uintptr_t stream) {
    std::vector<NVTEScalingGroup> g;
    g.reserve(groups.size());
    for (const auto& item : groups) {
      const py::tuple t = item.cast<py::tuple>();
      if (t.size() != 6) throw py::value_error("scaling group must have 6 items");
      NVTEScalingGroup s{};
      s.amax_history = reinterpret_cast<float*>(t[0].cast<uintptr_t>());
      s.scale = reinterpret_cast<float*>(t[1].cast<uintptr_t>());
      s.scale_inv = reinterpret_cast<float*>(t[2].cast<uintptr_t>());
      s.history_len = t[3].cast<int64_t>();
      s.num_tensors = t[4].cast<int64_t>();
      s.fp8_max = t[5].cast<float>();
      g.push_back(s);
    }
    check_status(nvte_delayed_scaling_update(g.data(), static_cast<int64_t>(g.size()),
                                             static_cast<NVTEAmaxAlgo>(algo), margin,
                                             stream_from_int(stream)));
  });
}

}  // namespace te_py
