// Host helper shared by the kernels' launchers and the GEMM backend.
#pragma once

#include <cuda_runtime.h>  // hipified to the HIP runtime on AMD

namespace te {

// Whether the stream is being captured into a graph (or cannot be asked: then treated as such).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace te
