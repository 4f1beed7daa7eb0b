// Float8CurrentScaling's scales of several tensors in one launch, for other op families that
// need them before a cast of their own (see nvte_current_scaling_scales in recipe.h: same
// arguments, same checks; errors are thrown, not returned).
#pragma once

#include "transformer_engine/transformer_engine.h"

namespace te {

void launch_current_scales(const NVTETensor* const* inputs, int64_t n, float* amax, int* counter,
                           float* scale, float* scale_inv, int* skipped, float fp8_max,
                           NVTEStream stream);

}  // namespace te
