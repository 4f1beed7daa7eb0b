"""LayerNorm / RMSNorm forward (input dtype and FP8 output) and backward.

Forward results are compared with the plain-torch reference at the shared tolerances; FP8 outputs
with the reference quantisation of the reference output (at most one FP8 step apart, almost all
bytes equal: the kernel's fp32 sums round differently from torch's). Gradients are compared with
torch autograd of the reference formula in float64, so the closed-form backward (native or
reference) is checked against an independent derivation.
"""
import pytest
import torch

from transformer_engine.pytorch import kernels
from transformer_engine.pytorch.kernels.normalization import (layernorm_fwd_reference,
                                                          rmsnorm_fwd_reference)
from utils import DEVICES, device_fp8_dtype, randn, tols

# (x dtype, weight dtype): same dtype, and 16-bit input with fp32 weights (mixed precision).
DTYPES = [(torch.float32, torch.float32), (torch.float16, torch.float16),
          (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
          (torch.float16, torch.float32)]
# Empty, odd (general path), short and long register-path rows, the long-row backward variant
# (16384), a row too long for registers (40000), and the ends of the range where 16-bit RMSNorm
# forward takes the looped kernel (4104 and 8192 columns: 513 and 1024 16-byte chunks).
SHAPES = [(0, 64), (1, 37), (37, 23), (5, 3, 128), (64, 768), (33, 1000), (37, 1001), (16, 4096),
          (5, 4104), (3, 8192), (4, 16384), (2, 40000)]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def dname(dt):
    return str(dt).replace("torch.", "")


def make_inputs(shape, x_dtype, w_dtype, device, seed):
    # A non-zero mean and spread per row make mean subtraction and eps matter.
    x = randn(shape, x_dtype, device, seed=seed, scale=2.0) + 0.5
    hidden = shape[-1]
    gamma = randn((hidden,), w_dtype, device, seed=seed + 1, scale=0.5) + 1.0
    beta = randn((hidden,), w_dtype, device, seed=seed + 2, scale=0.5)
    return x.to(x_dtype), gamma, beta


def forward(rms, x, gamma, beta, zcg, **fp8):
    if rms:
        return kernels.rmsnorm_fwd(x, gamma, 1e-5, zcg, **fp8)
    return kernels.layernorm_fwd(x, gamma, beta, 1e-5, zcg, **fp8)


def reference(rms, x, gamma, beta, zcg):
    x, gamma, beta = x.cpu(), gamma.cpu(), beta.cpu()
    if rms:
        z, rsigma = rmsnorm_fwd_reference(x, gamma, 1e-5, zcg)
        return z, None, rsigma
    return layernorm_fwd_reference(x, gamma, beta, 1e-5, zcg)


def close(got, want, dtype, what):
    torch.testing.assert_close(got.cpu().float(), want.float(), **tols(dtype), msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{dname(d[0])}-{dname(d[1])}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_reference(device, zcg, rms, dtypes, shape):
    x, gamma, beta = make_inputs(shape, *dtypes, device, seed=sum(shape))
    res = forward(rms, x, gamma, beta, zcg)
    z, mu, rsigma = reference(rms, x, gamma, beta, zcg)
    assert res.out.dtype == x.dtype and res.out.shape == x.shape and res.scale_inv is None
    close(res.out, z.to(x.dtype), x.dtype, "z")
    close(res.rsigma, rsigma, torch.float32, "rsigma")
    assert res.rsigma.shape == x.shape[:-1]
    if rms:
        assert res.mu is None
    else:
        close(res.mu, mu, torch.float32, "mu")


def fp8_steps(a, b):
    """Distance in representable FP8 values between two FP8 tensors of one dtype."""
    def ordinal(t):
        u = t.view(torch.uint8).int()
        mag = u & 0x7F
        return torch.where(u >= 0x80, -mag, mag)
    return (ordinal(a.cpu()) - ordinal(b.cpu())).abs()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", FP8, ids=dname)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtypes", DTYPES[1:4], ids=lambda d: f"{dname(d[0])}-{dname(d[1])}")
@pytest.mark.parametrize("shape", [(0, 64), (37, 23), (64, 768), (37, 1001), (16, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp8_output_matches_reference_quantization(device, fp8_dtype, rms, dtypes, shape):
    x, gamma, beta = make_inputs(shape, *dtypes, device, seed=3)
    scale = torch.tensor([12.5], device=device)
    amax = torch.full((1,), 0.25, device=device)  # max(previous, new) semantics
    res = forward(rms, x, gamma, beta, True, fp8_dtype=fp8_dtype, scale=scale, amax=amax)
    z, _, _ = reference(rms, x, gamma, beta, True)
    want, want_si, want_amax = kernels.quantize_reference(z, scale.cpu(), fp8_dtype)
    assert res.out.dtype == fp8_dtype and res.out.shape == x.shape
    assert torch.equal(res.scale_inv.cpu(), want_si)
    torch.testing.assert_close(amax.cpu(), torch.maximum(want_amax, torch.tensor([0.25])),
                               **tols(torch.float32))
    if x.numel():
        steps = fp8_steps(res.out, want)
        assert steps.max().item() <= 1, "more than one FP8 step from the reference"
        assert (steps == 0).float().mean().item() >= 0.99, "too many FP8 values off by one step"


def autograd_oracle(rms, x, gamma, beta, dz, zcg):
    """Gradients of the reference formula by torch autograd, in float64 on the CPU."""
    xd = x.detach().cpu().double().requires_grad_()
    gd = gamma.detach().cpu().double().requires_grad_()
    bd = beta.detach().cpu().double().requires_grad_()
    g = gd + 1.0 if zcg else gd
    if rms:
        z = xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-5) * g
    else:
        mu = xd.mean(-1, keepdim=True)
        z = (xd - mu) * torch.rsqrt((xd - mu).square().mean(-1, keepdim=True) + 1e-5) * g + bd
    z.backward(dz.detach().cpu().double())
    return xd.grad, gd.grad, bd.grad


def check_weight_grad(got, want, terms_abs_sum, dtype, what):
    """Column sums over rows: fp32 accumulation error grows with the summed magnitudes, so the
    absolute tolerance is per column, proportional to the sum of |terms|."""
    t = tols(dtype)
    got, want = got.cpu().double(), want.to(got.dtype).double()
    bound = t["atol"] + 1e-5 * terms_abs_sum + t["rtol"] * want.abs()
    err = (got - want).abs()
    assert bool((err <= bound).all()), (
        f"{what}: {int((err > bound).sum())} of {err.numel()} columns off; worst excess "
        f"{(err - bound).max().item():.3g}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zcg", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{dname(d[0])}-{dname(d[1])}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_autograd(device, zcg, rms, dtypes, shape):
    x, gamma, beta = make_inputs(shape, *dtypes, device, seed=sum(shape) + 11)
    dz = randn(shape, dtypes[0], device, seed=5)
    res = forward(rms, x, gamma, beta, zcg)
    if rms:
        dx, dgamma = kernels.rmsnorm_bwd(dz, x, res.rsigma, gamma, zcg)
        dbeta = None
    else:
        dx, dgamma, dbeta = kernels.layernorm_bwd(dz, x, res.mu, res.rsigma, gamma, zcg)
    want_dx, want_dg, want_db = autograd_oracle(rms, x, gamma, beta, dz, zcg)
    assert dx.dtype == x.dtype and dgamma.dtype == gamma.dtype
    # dx is a difference of terms of size |dz * g|; fp32 row sums set the error floor there.
    t = tols(x.dtype)
    row_scale = (dz.float().abs() * gamma.float().abs().max().cpu().item()).cpu().double()
    torch.testing.assert_close(dx.cpu().double(), want_dx.to(x.dtype).double(), rtol=t["rtol"],
                               atol=t["atol"] + 2e-6 * row_scale.max().item() if x.numel() else 1.0)
    hidden = shape[-1]
    dzf = dz.cpu().double().reshape(-1, hidden).abs()
    check_weight_grad(dgamma, want_dg, (dzf * 4.0).sum(0), gamma.dtype, "dgamma")
    if not rms:
        assert dbeta.dtype == gamma.dtype
        check_weight_grad(dbeta, want_db, dzf.sum(0), gamma.dtype, "dbeta")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: f"{dname(d[0])}-{dname(d[1])}")
@pytest.mark.parametrize("shape", [(1, 37), (37, 1001), (33, 1000), (16, 4096), (4, 16384),
                                   (2, 40000)], ids=lambda s: "x".join(map(str, s)))
def test_backward_adds_residual_gradient(device, rms, dtypes, shape):
    """dresidual is added into dx before the one rounding; the weight gradients are those of the
    plain backward, bit for bit (the same reductions)."""
    x, gamma, beta = make_inputs(shape, *dtypes, device, seed=sum(shape) + 3)
    dz = randn(shape, dtypes[0], device, seed=6)
    dres = randn(shape, dtypes[0], device, seed=7, scale=3.0)
    res = forward(rms, x, gamma, beta, False)
    if rms:
        plain = kernels.rmsnorm_bwd(dz, x, res.rsigma, gamma)
        fused = kernels.rmsnorm_bwd(dz, x, res.rsigma, gamma, dresidual=dres)
    else:
        plain = kernels.layernorm_bwd(dz, x, res.mu, res.rsigma, gamma)
        fused = kernels.layernorm_bwd(dz, x, res.mu, res.rsigma, gamma, dresidual=dres)
    for got, want in zip(fused[1:], plain[1:]):
        assert torch.equal(got, want)
    want_dx = autograd_oracle(rms, x, gamma, beta, dz, False)[0] + dres.cpu().double()
    t = tols(x.dtype)
    scale = max(dz.float().abs().max().item() * gamma.float().abs().max().item(), 1.0)
    torch.testing.assert_close(fused[0].cpu().double(), want_dx.to(x.dtype).double(),
                               rtol=t["rtol"], atol=t["atol"] + 2e-6 * scale)
    with pytest.raises(ValueError, match="dresidual has shape"):
        if rms:
            kernels.rmsnorm_bwd(dz, x, res.rsigma, gamma, dresidual=torch.cat([dres, dres]))
        else:
            kernels.layernorm_bwd(dz, x, res.mu, res.rsigma, gamma, dresidual=torch.cat([dres, dres]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_autograd_functions(device, rms):
    x, gamma, beta = make_inputs((6, 7, 96), torch.bfloat16, torch.float32, device, seed=9)
    dz = randn(x.shape, torch.bfloat16, device, seed=10)
    xr, gr, br = (t.detach().clone().requires_grad_() for t in (x, gamma, beta))
    out = kernels.rmsnorm(xr, gr, 1e-5) if rms else kernels.layernorm(xr, gr, br, 1e-5)
    out.backward(dz)
    want_dx, want_dg, want_db = autograd_oracle(rms, x, gamma, beta, dz, False)
    close(xr.grad, want_dx.to(x.dtype), x.dtype, "dx")
    dzsum = dz.cpu().double().reshape(-1, 96).abs().sum(0)
    check_weight_grad(gr.grad, want_dg, 4.0 * dzsum, torch.float32, "dgamma")
    if not rms:
        check_weight_grad(br.grad, want_db, dzsum, torch.float32, "dbeta")


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_name_op_and_argument(device):
    x = randn((4, 16), torch.bfloat16, device)
    gamma = torch.ones(16, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="layernorm_fwd: gamma has shape"):
        kernels.layernorm_fwd(x, gamma[:8], gamma)
    with pytest.raises(ValueError, match="rmsnorm_fwd: gamma has dtype float16"):
        kernels.rmsnorm_fwd(x, gamma.half())
    with pytest.raises(ValueError, match="layernorm_fwd: beta has dtype"):
        kernels.layernorm_fwd(x, gamma, gamma.float())
    with pytest.raises(ValueError, match="layernorm_bwd: rsigma has shape"):
        kernels.layernorm_bwd(x, x, torch.zeros(4, device=device), torch.zeros(3, device=device), gamma)
    with pytest.raises(ValueError, match="layernorm_fwd: scale"):
        kernels.layernorm_fwd(x, gamma, gamma, fp8_dtype=device_fp8_dtype(torch.float8_e4m3fn, device),
                          scale=torch.ones(2, device=device))
