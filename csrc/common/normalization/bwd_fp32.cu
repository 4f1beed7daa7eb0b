// Backward normalization kernels for fp32 inputs (one file per input dtype so the instantiations
// compile in parallel).
#include "normalization/norm_bwd.cuh"

namespace te {
namespace norm {
template int64_t run_norm_bwd_typed<float>(const NormBwdParams&, cudaStream_t, bool);
}  // namespace norm
}  // namespace te
