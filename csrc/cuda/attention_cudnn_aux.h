// Helpers of the cuDNN attention backend shared by its host file and its small device kernel.
#pragma once

#include <stdint.h>

namespace te {
namespace attention {

// Elements between consecutive tokens of q, k, v and o in the THD layout (heads * head dim when
// dense; more for views of a packed projection).
struct CudnnRaggedStrides {
  int64_t q, k, v, o;
};

// seqlen_*[i] = cu_*[i+1] - cu_*[i] for i < batch; when off_q is not null also the ragged offsets
// off_x[i] = cu_x[i] * strides.x for i <= batch. Launch errors are left for the caller's check.
void launch_seqlens_and_offsets(const int32_t* cu_q, const int32_t* cu_kv, int batch,
                                CudnnRaggedStrides strides, int32_t* seqlen_q, int32_t* seqlen_kv,
                                int32_t* off_q, int32_t* off_k, int32_t* off_v, int32_t* off_o,
                                void* stream);

}  // namespace attention
}  // namespace te
