// Every fused cast+transpose kernel of the sigmoid activation (forward, gated, backward with dbias;
// all dtypes). One file per activation so that they compile in parallel.
#include "transpose/act_producers.cuh"

TE_INSTANTIATE_ACT_CAST_TRANSPOSE(kNVTESigmoid)
