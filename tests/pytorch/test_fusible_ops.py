"""te.ops, the fusible-operations API: every operation against a plain-torch reference (forward,
input gradient, every parameter gradient), fused against unfused groups, FP8 recipes against
te.Linear and the high-precision reference, state_dict keys, and bad input."""
import pytest
import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te
from module_cases import autocast, make_recipe
from transformer_engine.common import recipe as te_recipe
from utils import DEVICES, randn, stable_seed, tols

ops = te.ops
HP_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randomize(module, seed):
    """Random parameters (never the zeros / ones of the default initialisation)."""
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(randn(p.shape, p.dtype, p.device, seed=seed + i, scale=0.5) + 0.1)
    return module


def _fp32_copies(module):
    return [p.detach().float().clone().requires_grad_(True) for p in module.parameters()]


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def _gated(fn):
    def ref(x):
        a, b = x.chunk(2, dim=-1)
        return fn(a) * b
    return ref


def _clamped_swiglu(x, limit=7.0, alpha=1.702):
    a, b = x.chunk(2, dim=-1)
    a = a.clamp(max=limit)
    return a * torch.sigmoid(alpha * a) * (b.clamp(-limit, limit) + 1.0)


def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


# name -> (factory(dtype, device), reference(x, *fp32 params), input last dim)
CASES = {
    "BasicLinear": (lambda d, dev: ops.BasicLinear(37, 23, device=dev, dtype=d),
                    lambda x, w: F.linear(x, w), 37),
    "Linear": (lambda d, dev: ops.Linear(37, 23, device=dev, dtype=d),
               lambda x, w, b: F.linear(x, w, b), 37),
    "Linear_nobias": (lambda d, dev: ops.Linear(37, 23, bias=False, device=dev, dtype=d),
                      lambda x, w: F.linear(x, w), 37),
    "Bias": (lambda d, dev: ops.Bias(37, device=dev, dtype=d), lambda x, b: x + b, 37),
    "LayerNorm": (lambda d, dev: ops.LayerNorm(37, device=dev, dtype=d),
                  lambda x, w, b: F.layer_norm(x, (37,), w, b, 1e-5), 37),
    "LayerNorm_zero_centered": (
        lambda d, dev: ops.LayerNorm(37, eps=1e-3, zero_centered_gamma=True, device=dev, dtype=d),
        lambda x, w, b: F.layer_norm(x, (37,), 1.0 + w, b, 1e-3), 37),
    "LayerNorm_2d_shape": (lambda d, dev: ops.LayerNorm((3, 37), device=dev, dtype=d),
                           lambda x, w, b: F.layer_norm(x, (3, 37), w, b, 1e-5), 37),
    "RMSNorm": (lambda d, dev: ops.RMSNorm(37, device=dev, dtype=d), _rms, 37),
    "L2Normalization": (lambda d, dev: ops.L2Normalization(eps=1e-4),
                        lambda x: x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-4), 37),
    "GELU": (lambda d, dev: ops.GELU(), _gelu_tanh, 37),
    "QGELU": (lambda d, dev: ops.QGELU(), lambda x: x * torch.sigmoid(1.702 * x), 37),
    "ReLU": (lambda d, dev: ops.ReLU(), F.relu, 37),
    "SReLU": (lambda d, dev: ops.SReLU(), lambda x: F.relu(x) ** 2, 37),
    "SiLU": (lambda d, dev: ops.SiLU(), F.silu, 37),
    "GLU": (lambda d, dev: ops.GLU(), _gated(torch.sigmoid), 38),
    "GEGLU": (lambda d, dev: ops.GEGLU(), _gated(_gelu_tanh), 38),
    "QGEGLU": (lambda d, dev: ops.QGEGLU(), _gated(lambda a: a * torch.sigmoid(1.702 * a)), 38),
    "ReGLU": (lambda d, dev: ops.ReGLU(), _gated(F.relu), 38),
    "SReGLU": (lambda d, dev: ops.SReGLU(), _gated(lambda a: F.relu(a) ** 2), 38),
    "SwiGLU": (lambda d, dev: ops.SwiGLU(), _gated(F.silu), 38),
    "ClampedSwiGLU": (lambda d, dev: ops.ClampedSwiGLU(limit=1.5, alpha=1.1),
                      lambda x: _clamped_swiglu(x, 1.5, 1.1), 38),
    "Identity": (lambda d, dev: ops.Identity(), lambda x: x, 37),
    "Reshape": (lambda d, dev: ops.Reshape((-1, 37)), lambda x: x.reshape(-1, 37), 37),
    "ConstantScale": (lambda d, dev: ops.ConstantScale(-0.37), lambda x: -0.37 * x, 37),
    "Dropout_p0": (lambda d, dev: ops.Dropout(0.0), lambda x: x, 37),
    "AllReduce_single_process": (lambda d, dev: ops.AllReduce(), lambda x: x, 37),
    "AllGather_single_process": (lambda d, dev: ops.AllGather(), lambda x: x, 37),
    "ReduceScatter_single_process": (lambda d, dev: ops.ReduceScatter(), lambda x: x, 37),
}


def _compare(op, ref_fn, x, dtype, seed):
    """Forward, input gradient and every parameter gradient of op against ref_fn in fp32."""
    params = _fp32_copies(op)
    xr = x.detach().float().clone().requires_grad_(True)
    y = op(x)
    ref = ref_fn(xr, *params)
    assert y.shape == ref.shape and y.dtype == dtype
    torch.testing.assert_close(y, ref.to(dtype), **tols(dtype))
    dy = randn(y.shape, dtype, y.device, seed=seed + 99)
    y.backward(dy)
    ref.backward(dy.float())
    torch.testing.assert_close(x.grad, xr.grad.to(dtype), **tols(dtype))
    for (name, p), q in zip(op.named_parameters(), params):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad.to(p.dtype), **tols(dtype), msg=name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_torch_reference(case, dtype, device):
    factory, ref_fn, last = CASES[case]
    seed = stable_seed(case, dtype)
    op = _randomize(factory(dtype, device), seed)
    x = randn((5, 3, last), dtype, device, seed=seed).requires_grad_(True)  # odd sizes
    _compare(op, ref_fn, x, dtype, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    op = _randomize(ops.Linear(37, 23, device=device), 3)
    x = torch.empty(0, 37, device=device, requires_grad=True)
    y = op(x)
    assert y.shape == (0, 23)
    y.sum().backward()
    assert x.grad.shape == (0, 37)
    assert torch.equal(op.weight.grad, torch.zeros_like(op.weight))
    assert torch.equal(op.bias.grad, torch.zeros_like(op.bias))


@pytest.mark.parametrize("device", DEVICES)
def test_dropout(device):
    p = 0.3
    op = ops.Dropout(p)
    x = (randn((41, 29), torch.float32, device, seed=5) + 3.0).requires_grad_(True)  # no zeros
    y = op(x)
    kept = y != 0
    assert 0.5 < kept.float().mean().item() < 0.9
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    dy = randn(y.shape, torch.float32, device, seed=6)
    y.backward(dy)
    torch.testing.assert_close(x.grad, torch.where(kept, dy / (1 - p), torch.zeros_like(dy)))
    op.eval()
    assert torch.equal(op(x), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HP_DTYPES)
def test_extra_input_and_output(device, dtype):
    """A residual block: MakeExtraOutput branches, AddExtraInput adds a second input."""
    seed = stable_seed("residual", dtype)
    lin = _randomize(ops.Linear(37, 37, device=device, dtype=dtype), seed)
    model = ops.Sequential(ops.MakeExtraOutput(), lin, ops.GELU(), ops.AddExtraInput())
    x = randn((7, 37), dtype, device, seed=seed).requires_grad_(True)
    r = randn((7, 37), dtype, device, seed=seed + 1).requires_grad_(True)
    y, branch = model(x, r)
    w, b = _fp32_copies(lin)
    xr = x.detach().float().requires_grad_(True)
    rr = r.detach().float().requires_grad_(True)
    def rnd(t):  # each operation rounds its output to the compute dtype
        return t.to(dtype).float()
    ref = rnd(rnd(_gelu_tanh(rnd(F.linear(xr, w, b)))) + rr)
    torch.testing.assert_close(branch, x.detach())
    dy = randn(y.shape, dtype, device, seed=seed + 2)
    dbranch = randn(y.shape, dtype, device, seed=seed + 3)
    torch.autograd.backward([y, branch], [dy, dbranch])
    ref.backward(dy.float())
    # the two gradients of x meet in the compute dtype, as autograd would add them
    torch.testing.assert_close(x.grad, xr.grad.to(dtype) + dbranch, **tols(dtype))
    torch.testing.assert_close(r.grad, rr.grad.to(dtype), **tols(dtype))
    torch.testing.assert_close(lin.weight.grad, w.grad.to(dtype), **tols(dtype))


def _norm_mlp(dtype, device, seed, norm="LayerNorm", hidden=48, ffn=64):
    norm_op = getattr(ops, norm)(hidden, device=device, dtype=dtype)
    model = ops.Sequential(norm_op, ops.Linear(hidden, ffn, device=device, dtype=dtype),
                           ops.GELU(), ops.Linear(ffn, hidden, device=device, dtype=dtype))
    return _randomize(model, seed)


def _run_unfused(model, x):
    """The same operations, each called alone (its own group: nothing fuses)."""
    for module in model:
        ops_list = module.basic_op_list
        for op in ops_list:
            x = op(x)
    return x


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _fused_vs_unfused(fused, unfused, x, dy, recipe, groups):
    """Runs both (the unfused one operation by operation) and compares outputs and gradients;
    returns the fused output."""
    assert [type(g).__name__ for g in fused._module_groups()[0]._current_groups()] == groups
    xu = x.detach().clone().requires_grad_(True)
    with autocast(recipe):
        y = fused(x)
    with autocast(recipe):
        yu = _run_unfused(unfused, xu)
    y.backward(dy)
    yu.backward(dy)
    pairs = [(y, yu), (x.grad, xu.grad)] + list(zip(_grads(fused), _grads(unfused)))
    for a, b in pairs:
        if recipe == "none":
            torch.testing.assert_close(a, b, **tols(x.dtype))
        else:
            # FP8: a fused norm quantizes its fp32 result, the unfused path its bf16 result
            # (double rounding), and an unfused bias is added after rounding, so some elements
            # land one FP8 step apart: the difference stays below one E4M3 step (2^-4) relative
            # to the result as a whole
            assert (a.float() - b.float()).norm() <= 2.0 ** -4 * b.float().norm()
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_fused_equals_unfused(device, recipe, norm):
    # high precision in fp32, where one extra rounding (a bias added after the GEMM instead of
    # in its epilogue) stays far below the tolerance through the whole block
    dtype = torch.float32 if recipe == "none" else torch.bfloat16
    seed = stable_seed("fusion", recipe, norm)
    fused, unfused = _norm_mlp(dtype, device, seed, norm), _norm_mlp(dtype, device, seed, norm)
    x = randn((32, 48), dtype, device, seed=seed).requires_grad_(True)
    dy = randn((32, 48), dtype, device, seed=seed + 1)
    _fused_vs_unfused(fused, unfused, x, dy, recipe, ["NormLinear", "SingleOp", "LinearBias"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
def test_linear_gelu_fusion(device, recipe):
    """Linear + GELU: the fused dGELU + dbias backward, against the same operations unfused and
    (high precision) the fp32 reference."""
    dtype = torch.float32 if recipe == "none" else torch.bfloat16
    seed = stable_seed("linear_gelu", recipe)
    shape = (21, 37, 23) if recipe == "none" else (32, 48, 64)  # odd sizes where FP8 allows

    def make():
        return _randomize(ops.Sequential(ops.Linear(shape[1], shape[2], device=device, dtype=dtype),
                                         ops.GELU()), seed)
    fused, unfused = make(), make()
    x = randn((shape[0], shape[1]), dtype, device, seed=seed).requires_grad_(True)
    dy = randn((shape[0], shape[2]), dtype, device, seed=seed + 1)
    y = _fused_vs_unfused(fused, unfused, x, dy, recipe, ["LinearBiasGELU"])
    if recipe == "none":
        lin = fused[0]
        w, b = _fp32_copies(lin)
        xr = x.detach().clone().requires_grad_(True)
        ref = _gelu_tanh(F.linear(xr, w, b))
        ref.backward(dy)
        torch.testing.assert_close(y, ref, **tols(dtype))
        torch.testing.assert_close(x.grad, xr.grad, **tols(dtype))
        torch.testing.assert_close(lin.weight.grad, w.grad, **tols(dtype))
        torch.testing.assert_close(lin.bias.grad, b.grad, **tols(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_linear_matches_te_linear(device, recipe, bias):
    """Same recipe, same weights, same kernels: te.ops.Linear and te.Linear agree over
    several steps (delayed scaling: the scales move after the first)."""
    dtype = torch.bfloat16
    seed = stable_seed("fp8", recipe, bias)
    op = _randomize(ops.Linear(48, 64, bias=bias, device=device, dtype=dtype), seed)
    mod = te.Linear(48, 64, bias=bias, params_dtype=dtype, device=device)
    with torch.no_grad():
        mod.weight.copy_(op.weight)
        if bias:
            mod.bias.copy_(op.bias)
    for step in range(3):
        x = randn((2, 16, 48), dtype, device, seed=seed + step).requires_grad_(True)
        xm = x.detach().clone().requires_grad_(True)
        dy = randn((2, 16, 64), dtype, device, seed=seed + 10 + step)
        with autocast(recipe):
            y = op(x)
        with autocast(recipe):
            ym = mod(xm)
        y.backward(dy)
        ym.backward(dy)
        torch.testing.assert_close(y, ym, **tols(dtype))
        torch.testing.assert_close(x.grad, xm.grad, **tols(dtype))
        torch.testing.assert_close(op.weight.grad, mod.weight.grad, **tols(dtype))
        if bias:
            torch.testing.assert_close(op.bias.grad, mod.bias.grad, **tols(dtype))
    # and close to the high-precision result (the FP8 error relative to the output's size)
    ref = F.linear(x.detach().float(), op.weight.float(), op.bias.float() if bias else None)
    err = (y.float() - ref).norm() / ref.norm()
    assert err < 0.1, err
    rs = op.basic_ops[0]._fp8_state
    if recipe == "delayed":
        assert not torch.equal(rs.scale_fwd, torch.ones_like(rs.scale_fwd))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_quantize_feeds_linear(device, recipe):
    dtype = torch.bfloat16
    seed = stable_seed("quantize", recipe)
    lin = _randomize(ops.Linear(48, 32, device=device, dtype=dtype), seed)
    model = ops.Sequential(ops.Quantize(forward=True, backward=True), lin)
    x = randn((16, 48), dtype, device, seed=seed).requires_grad_(True)
    with autocast(recipe):
        y = model(x)
    y.backward(randn(y.shape, dtype, device, seed=seed + 1))
    ref = F.linear(x.detach().float(), lin.weight.float(), lin.bias.float())
    assert (y.float() - ref).norm() / ref.norm() < 0.1
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert torch.equal(ops.Quantize()(x), x)  # no FP8 autocast: the identity
    with autocast(recipe):
        xq = ops.Quantize()(x)
    assert isinstance(xq, te.Float8Tensor)
    torch.testing.assert_close(xq.dequantize(dtype), x.detach(), **tols(torch.float8_e4m3fn))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "delayed", "current"])
def test_quantized_model_init_weights(device, recipe):
    """Weights kept only in FP8: the GEMMs use the stored FP8 data (the high-precision run uses
    its dequantised value), and the weight still gets its gradient."""
    dtype = torch.bfloat16
    seed = stable_seed("fp8_weights", recipe)
    with te.quantized_model_init(preserve_high_precision_init_val=True):
        op = ops.Linear(48, 32, device=device, dtype=dtype)
    w = op.weight
    assert isinstance(w, te.Float8Tensor) and w.dtype == dtype
    hp = w.get_high_precision_init_val()
    torch.testing.assert_close(w.dequantize(torch.float32), hp.float().to(device),
                               **tols(torch.float8_e4m3fn))
    x = randn((16, 48), dtype, device, seed=seed).requires_grad_(True)
    dy = randn((16, 32), dtype, device, seed=seed + 1)
    with autocast(recipe):
        y = op(x)
    y.backward(dy)
    w_hp = w.dequantize(dtype).float()  # the value the high-precision GEMM reads
    ref = F.linear(x.detach().float(), w_hp, op.bias.detach().float())
    if recipe == "none":  # the dequantised weight, exactly
        torch.testing.assert_close(y, ref.to(dtype), **tols(dtype))
        dw = dy.float().T @ x.detach().float()
        torch.testing.assert_close(w.grad, dw.to(dtype), **tols(dtype))
    else:
        assert (y.float() - ref).norm() <= 2.0 ** -4 * ref.norm()
        assert w.grad is not None and w.grad.shape == w.shape and torch.isfinite(w.grad).all()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["none", "current"])
def test_accumulate_into_main_grad(device, recipe):
    dtype = torch.bfloat16
    seed = stable_seed("main_grad", recipe)
    op = _randomize(ops.Linear(48, 32, device=device, dtype=dtype,
                               accumulate_into_main_grad=True), seed)
    ref_op = _randomize(ops.Linear(48, 32, device=device, dtype=dtype), seed)
    start = randn(op.weight.shape, torch.float32, device, seed=seed + 5)
    op.weight.main_grad = start.clone()
    x = randn((16, 48), dtype, device, seed=seed)
    dy = randn((16, 32), dtype, device, seed=seed + 1)
    with autocast(recipe):
        y = op(x)
    with autocast(recipe):
        y_ref = ref_op(x)
    y.backward(dy)
    y_ref.backward(dy)
    assert op.weight.grad is None and op.weight.grad_added_to_main_grad is True
    # main_grad holds start + dW in fp32 (no bf16 rounding of dW): what was added is dW
    torch.testing.assert_close((op.weight.main_grad - start).to(dtype), ref_op.weight.grad,
                               **tols(dtype))
    torch.testing.assert_close(op.bias.grad, ref_op.bias.grad, **tols(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_autocast_dtype(device):
    op = _randomize(ops.Sequential(ops.LayerNorm(37, device=device),
                                   ops.Linear(37, 23, device=device)), 4)
    x = randn((5, 37), torch.float32, device, seed=4).requires_grad_(True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = op(x)
    assert y.dtype == torch.bfloat16
    ln, lin = op[0], op[1]
    def bf16(t):  # what autocast rounds: the input, the weight, the bias, each op's output
        return t.detach().to(torch.bfloat16).float()
    z = bf16(F.layer_norm(bf16(x), (37,), ln.weight, ln.bias))
    ref = F.linear(z, bf16(lin.weight), bf16(lin.bias))
    torch.testing.assert_close(y, ref.to(torch.bfloat16), **tols(torch.bfloat16))
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_sequential_mixes_torch_modules(device):
    seed = stable_seed("mixed")
    lin1 = _randomize(ops.Linear(19, 24, device=device), seed)
    lin2 = _randomize(ops.BasicLinear(24, 7, device=device), seed + 10)
    model = ops.Sequential(lin1, torch.nn.Tanh(), lin2, ops.ConstantScale(3.0))
    assert len(model) == 4 and model[1].__class__ is torch.nn.Tanh
    x = randn((2, 5, 19), torch.float32, device, seed=seed)
    ref = 3.0 * F.linear(torch.tanh(F.linear(x, lin1.weight, lin1.bias)), lin2.weight)
    torch.testing.assert_close(model(x), ref, **tols(torch.float32))
    model.append(ops.AddExtraInput())
    with _raises(ValueError, "Sequential", "extra input"):
        model(x)
    with _raises(ValueError, "Sequential", "extra input"):
        model(x, x, x)
    r = randn((2, 5, 7), torch.float32, device, seed=seed + 1)
    torch.testing.assert_close(model(x, r), ref + r, **tols(torch.float32))
    scale = model.pop(3)
    assert isinstance(scale, ops.ConstantScale) and len(model) == 4
    torch.testing.assert_close(model(x, r), ref / 3.0 + r, **tols(torch.float32))
    model.insert(0, ops.Identity())
    del model[-1]
    model[2] = torch.nn.Sigmoid()
    assert [k for k, _ in model.named_children()] == ["0", "1", "2", "3"]
    ref2 = F.linear(torch.sigmoid(F.linear(x, lin1.weight, lin1.bias)), lin2.weight)
    torch.testing.assert_close(model(x), ref2, **tols(torch.float32))


def test_meta_device_then_to_empty():
    model = ops.Sequential(ops.LayerNorm(16, device="meta"), ops.Linear(16, 8, device="meta"))
    assert all(p.device.type == "meta" for p in model.parameters())
    model.to_empty(device="cpu")
    for op in (model[0], model[1].basic_ops[0], model[1].basic_ops[1]):
        op.reset_parameters()
    assert torch.equal(model[0].weight, torch.ones(16))
    assert torch.equal(model[1].bias, torch.zeros(8))
    w = model[1].weight
    assert w.abs().max() <= 1 / 4 and w.abs().max() > 0  # Kaiming uniform: bound 1/sqrt(16)
    x = randn((3, 16), torch.float32, "cpu", seed=1)
    torch.testing.assert_close(model(x), F.linear(F.layer_norm(x, (16,)), w),
                               **tols(torch.float32))


def test_state_dict_keys_follow_the_api():
    model = ops.Sequential(ops.LayerNorm(16, device="cpu"), ops.Linear(16, 32, device="cpu"),
                           ops.GELU(), ops.Linear(32, 16, bias=False, device="cpu"),
                           ops.RMSNorm(16, device="cpu"))
    params = [k for k in model.state_dict() if not k.endswith("_extra_state")]
    assert params == ["0.weight", "0.bias", "1.basic_ops.0.weight", "1.basic_ops.1.bias",
                      "3.basic_ops.0.weight", "4.weight"]
    extra = [k for k in model.state_dict() if k.endswith("_extra_state")]
    assert extra == ["0._extra_state", "1.basic_ops.0._extra_state", "1.basic_ops.1._extra_state",
                     "2._extra_state", "3.basic_ops.0._extra_state", "4._extra_state"]


def test_calibration_records_amaxes():
    """autocast(enabled=False, calibrating=True): high-precision results, and the delayed-scaling
    scales computed from the recorded amaxes (margin 0: fp8_max / amax)."""
    seed = stable_seed("calibration")
    model = _randomize(ops.Sequential(ops.LayerNorm(32, device="cpu"),
                                      ops.Linear(32, 48, device="cpu"), ops.Quantize()), seed)
    x = randn((16, 32), torch.float32, "cpu", seed=seed, scale=3.0)
    with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=te_recipe.DelayedScaling()):
        y = model(x)
    ln, lin = model[0], model[1]
    z = F.layer_norm(x, (32,), ln.weight, ln.bias)
    torch.testing.assert_close(y, F.linear(z, lin.weight, lin.bias), **tols(torch.float32))
    y.sum().backward()
    assert lin.weight.grad is not None
    rs = lin.basic_ops[0]._fp8_state
    amax = torch.stack([z.detach().abs().max(), lin.weight.detach().abs().max()])
    torch.testing.assert_close(rs.scale_fwd, rs.fwd_max / amax)
    assert model[2]._fp8_state is None  # Quantize records nothing while calibrating


@pytest.mark.parametrize("device", DEVICES)
def test_inference_mode_then_training(device):
    """FP8 state first made under torch.inference_mode serves a later training step."""
    dtype = torch.bfloat16
    seed = stable_seed("inference_mode")
    op = _randomize(ops.Sequential(ops.LayerNorm(32, device=device, dtype=dtype),
                                   ops.Linear(32, 48, device=device, dtype=dtype)), seed)
    x = randn((16, 32), dtype, device, seed=seed)
    with torch.inference_mode(), autocast("delayed"):
        y_inf = op(x)
    assert not op[1].basic_ops[0]._fp8_state.scale_fwd.is_inference()
    xt = x.clone().requires_grad_(True)
    with autocast("delayed"):
        y = op(xt)
    y.float().sum().backward()
    assert xt.grad is not None and op[1].weight.grad is not None
    assert (y.detach().float() - y_inf.float()).norm() <= 2.0 ** -4 * y_inf.float().norm()


def test_fp8_state_survives_state_dict():
    seed = stable_seed("fp8_state")
    model = _randomize(ops.Sequential(ops.Linear(32, 48, device="cpu", dtype=torch.bfloat16)), seed)
    for step in range(2):
        with autocast("delayed"):
            y = model(randn((16, 32), torch.bfloat16, "cpu", seed=seed + step))
        y.float().sum().backward()
    saved = model.state_dict()
    fresh = ops.Sequential(ops.Linear(32, 48, device="cpu", dtype=torch.bfloat16))
    fresh.load_state_dict(saved)
    x = randn((16, 32), torch.bfloat16, "cpu", seed=seed + 7)
    with autocast("delayed"):
        a = model(x)
    with autocast("delayed"):
        b = fresh(x)
    assert torch.equal(a, b)


# ----- bad input ---------------------------------------------------------------------------

def _raises(exc, op_cls, match):
    return pytest.raises(exc, match=rf"transformer_engine\.pytorch\.ops\.{op_cls}.*{match}")


def test_bad_input_shape_and_dtype():
    lin = ops.Linear(16, 8, device="cpu")
    with _raises(ValueError, "BasicLinear", "in_features"):
        lin(torch.randn(4, 15))
    with _raises(TypeError, "BasicLinear", "dtype int64"):
        lin(torch.ones(4, 16, dtype=torch.int64))
    with _raises(TypeError, "BasicLinear", "torch.Tensor"):
        lin([1.0] * 16)
    with _raises(ValueError, "SwiGLU", "even last dimension"):
        ops.SwiGLU()(torch.randn(4, 15))
    with _raises(ValueError, "LayerNorm", "normalized_shape"):
        ops.LayerNorm(16, device="cpu")(torch.randn(4, 17))
    with _raises(ValueError, "Bias", "bias size"):
        ops.Bias(16, device="cpu")(torch.randn(4, 17))
    with _raises(ValueError, "AddExtraInput", "extra input"):
        ops.AddExtraInput()(torch.randn(4, 16))
    with _raises(ValueError, "AddExtraInput", "shape"):
        ops.AddExtraInput()(torch.randn(4, 16), torch.randn(4, 17))
    with _raises(ValueError, "Reshape", "reshaped"):
        ops.Reshape((5, -1))(torch.randn(4, 16))
    elsewhere = torch.empty(4, 16, device="meta")  # a device other than the parameters
    for op, name in ((lin, "BasicLinear"), (ops.Bias(16, device="cpu"), "Bias"),
                     (ops.RMSNorm(16, device="cpu"), "RMSNorm")):
        with _raises(ValueError, name, "input is on meta; expected cpu"):
            op(elsewhere)


def test_bad_constructor_arguments():
    with _raises(ValueError, "BasicLinear", "in_features"):
        ops.BasicLinear(0, 8, device="cpu")
    with _raises(ValueError, "BasicLinear", "tensor_parallel_mode"):
        ops.BasicLinear(8, 8, device="cpu", tensor_parallel_mode="diagonal")
    with _raises(TypeError, "BasicLinear", "dtype"):
        ops.BasicLinear(8, 8, device="cpu", dtype=torch.int32)
    with _raises(NotImplementedError, "BasicLinear", "userbuffers_options"):
        ops.BasicLinear(8, 8, device="cpu", userbuffers_options={})
    with _raises(ValueError, "Dropout", "probability"):
        ops.Dropout(1.5)
    with _raises(ValueError, "LayerNorm", "normalized_shape"):
        ops.LayerNorm(0, device="cpu")
    with _raises(NotImplementedError, "AddExtraInput", "in_place"):
        ops.AddExtraInput(in_place=True)
    with _raises(NotImplementedError, "SwiGLU", "glu_interleave_size"):
        ops.SwiGLU(glu_interleave_size=32)
    with _raises(TypeError, "Sequential", "torch.nn.Module"):
        ops.Sequential(3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        ops.Linear(8, 8, device="cpu", activaton="relu")
    for name in ("GroupedLinear", "ScaledSwiGLU", "SiTUGLU"):
        with _raises(NotImplementedError, name, "not supported"):
            getattr(ops, name)(4, 8, 8)
    with _raises(NotImplementedError, "register_forward_fusion", "not supported"):
        ops.register_forward_fusion(lambda o: o)


def test_fp8_refusals():
    lin = ops.Linear(24, 16, device="cpu", dtype=torch.bfloat16)
    x = torch.randn(16, 24, dtype=torch.bfloat16)
    with _raises(ValueError, "BasicLinear", "multiples of 16"):
        with autocast("current"):
            lin(x)
    # (quantized_model_init itself may refuse the recipe first: either way it is refused)
    with pytest.raises(NotImplementedError, match="Float8BlockScaling"):
        with te.quantized_model_init(recipe=te_recipe.Float8BlockScaling()):
            ops.BasicLinear(128, 128, device="cpu")
    with _raises(NotImplementedError, "BasicLinear", "Float8BlockScaling"):
        with te.fp8_autocast(fp8_recipe=te_recipe.Float8BlockScaling()):
            lin32 = ops.Linear(32, 16, device="cpu", dtype=torch.bfloat16)
            lin32(torch.randn(16, 32, dtype=torch.bfloat16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_inference_mode_makes_no_fp8_weight_transpose(device, recipe):
    """Under inference_mode no backward follows: an FP8-only weight keeps no transpose (the
    memory NVIDIA TE's inference check counts), though its parameters require grad."""
    with torch.no_grad(), te.quantized_model_init(recipe=make_recipe(recipe)):
        op = ops.Linear(32, 48, device=device)
    assert op.weight.requires_grad and op.weight._transpose is None
    x = randn((16, 32), torch.float32, device, seed=stable_seed("inference", recipe))
    with torch.inference_mode(), autocast(recipe):
        y = op(x)
    assert y.shape == (16, 48) and op.weight._transpose is None
    with autocast(recipe):  # a training step still makes and uses it
        op(x.clone().requires_grad_(True)).sum().backward()
    assert op.weight._transpose is not None and op.weight.grad is not None
