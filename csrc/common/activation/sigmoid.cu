// Every kernel of the sigmoid activation (plain, gated, backward, dbias; all dtypes). One file per
// activation so that they compile in parallel.
#include "activation/activation_kernels.cuh"

TE_INSTANTIATE_ACTIVATION(kNVTESigmoid)
