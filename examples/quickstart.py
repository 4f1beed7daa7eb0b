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
te.kernels.compute_amax(x, amax)
scale = fp8_recipe.fp8_format.value.max_fwd_for(te.capability(device).fp8_flavor) / amax
data, data_t, scale_inv = te.kernels.cast_transpose(x, scale, fwd_dtype)
back = te.kernels.dequantize(data, scale_inv, torch.bfloat16)
err = ((back.float() - x.float()).norm() / x.float().norm()).item()
print(f"{device}: {tuple(x.shape)} -> {data.dtype} + transpose {tuple(data_t.shape)}, "
      f"relative round-trip error {err:.4f}")
assert err < 0.05

# The quickstart of NVIDIA Transformer Engine, unchanged except for the device (on a machine
# without a GPU the same code runs on the reference backend with FP8 emulated).
model = te.Linear(768, 3072, bias=True)
inp = torch.randn(2048, 768, device=device)
with te.fp8_autocast(enabled=True, fp8_recipe=recipe.DelayedScaling(margin=0, fp8_format=recipe.Format.E4M3)):
    out = model(inp)
out.sum().backward()
ref = torch.nn.functional.linear(inp, model.weight, model.bias)
err = ((out - ref).norm() / ref.norm()).item()
print(f"te.Linear under fp8_autocast on {device}: out {tuple(out.shape)}, weight grad "
      f"{tuple(model.weight.grad.shape)}, relative error vs fp32 {err:.4f}")
assert out.shape == (2048, 3072) and model.weight.grad is not None and err < 0.1
