// Forward normalization kernels for bf16 inputs (one file per input dtype so the instantiations
// compile in parallel).
#include "normalization/norm_fwd.cuh"

namespace te {
namespace norm {
template void launch_norm_fwd_typed<bf16>(const NormFwdParams&, cudaStream_t);
}  // namespace norm
}  // namespace te
