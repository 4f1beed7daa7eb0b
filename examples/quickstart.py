"""Quickstart on the default backend: the native kernels on an NVIDIA/AMD GPU, the plain-torch
reference elsewhere. Prints what ran where, then casts a tensor to FP8 and back."""
import torch

import transformer_engine.pytorch as te
from transformer_engine.__main__ import info
from transformer_engine.common import recipe

print(info())
device = "cuda" if torch.cuda.is_available() else "cpu"
fp8_recipe = recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.HYBRID)
fwd_dtype = te.fp8_dtype("e4m3", device)  # float8_e4m3fn, or float8_e4m3fnuz on MI300
x = torch.randn(2048, 768, device=device, dtype=torch.bfloat16)

amax = torch.zeros(1, device=device)
te.ops.compute_amax(x, amax)
scale = fp8_recipe.fp8_format.value.max_fwd_for(te.capability(device).fp8_flavor) / amax
data, data_t, scale_inv = te.ops.cast_transpose(x, scale, fwd_dtype)
back = te.ops.dequantize(data, scale_inv, torch.bfloat16)
err = ((back.float() - x.float()).norm() / x.float().norm()).item()
print(f"{device}: {tuple(x.shape)} -> {data.dtype} + transpose {tuple(data_t.shape)}, "
      f"relative round-trip error {err:.4f}")
assert err < 0.05
