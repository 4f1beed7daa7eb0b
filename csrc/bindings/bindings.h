// Shared pieces of the pybind11 module: descriptors from Python tuples and status -> exception.
// Plain C++ over the C API: no CUDA/HIP, torch or JAX headers, so one binary serves any torch.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "transformer_engine/recipe.h"
#include "transformer_engine/transformer_engine.h"

namespace te_py {

namespace py = pybind11;

// Python describes a tensor as (data_ptr, shape, dtype, amax_ptr, scale_ptr, scale_inv_ptr);
// the three trailing pointers are 0 when unused.
NVTETensor tensor_from_tuple(const py::tuple& t);

// Raises ValueError / NotImplementedError / RuntimeError carrying the core's message.
void check_status(NVTEStatus status);

inline NVTEStream stream_from_int(uintptr_t s) { return reinterpret_cast<NVTEStream>(s); }

// Delayed-scaling groups given as a list of (history_ptr, scale_ptr, scale_inv_ptr, history_len,
// num_tensors, fp8_max[, skipped_ptr]) tuples, and nvte_delayed_scaling_update on them
// (recipe.cpp).
std::vector<NVTEScalingGroup> scaling_groups_from_list(const py::list& groups);
void delayed_scaling_update_from_list(const py::list& groups, int algo, float margin,
                                      NVTEStream stream);

void register_device(py::module_& m);
void register_cast(py::module_& m);
void register_recipe(py::module_& m);
void register_normalization(py::module_& m);
void register_softmax(py::module_& m);
void register_gemm(py::module_& m);
void register_gemm_library(py::module_& m);
void register_activation(py::module_& m);
void register_rope(py::module_& m);
void register_attention(py::module_& m);
void register_linear_step(py::module_& m);

}  // namespace te_py
