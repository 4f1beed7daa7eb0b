// Device-side inputs of the cuDNN attention graphs derived from cu_seqlens: per-sequence lengths
// (padding masks) and, for the THD layout, ragged element offsets of q/k/v/o.
#include <cuda_runtime.h>

#include <stdint.h>

#include "attention_cudnn_aux.h"

namespace te {
namespace attention {
namespace {

__global__ void seqlens_and_offsets_kernel(const int32_t* cu_q, const int32_t* cu_kv, int batch,
                                           CudnnRaggedStrides strides, int32_t* seqlen_q,
                                           int32_t* seqlen_kv, int32_t* off_q, int32_t* off_k,
                                           int32_t* off_v, int32_t* off_o) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= batch; i += gridDim.x * blockDim.x) {
    if (i < batch) {
      seqlen_q[i] = cu_q[i + 1] - cu_q[i];
      seqlen_kv[i] = cu_kv[i + 1] - cu_kv[i];
    }
    if (off_q != nullptr) {
      off_q[i] = static_cast<int32_t>(int64_t(cu_q[i]) * strides.q);
      off_k[i] = static_cast<int32_t>(int64_t(cu_kv[i]) * strides.k);
      off_v[i] = static_cast<int32_t>(int64_t(cu_kv[i]) * strides.v);
      off_o[i] = static_cast<int32_t>(int64_t(cu_q[i]) * strides.o);
    }
  }
}

}  // namespace

void launch_seqlens_and_offsets(const int32_t* cu_q, const int32_t* cu_kv, int batch,
                                CudnnRaggedStrides strides, int32_t* seqlen_q, int32_t* seqlen_kv,
                                int32_t* off_q, int32_t* off_k, int32_t* off_v, int32_t* off_o,
                                void* stream) {
  const int threads = 128;
  const int blocks = (batch + threads) / threads;
  seqlens_and_offsets_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(
      cu_q, cu_kv, batch, strides, seqlen_q, seqlen_kv, off_q, off_k, off_v, off_o);
}

}  // namespace attention
}  // namespace te
