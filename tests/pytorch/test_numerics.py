"""Numerics of every module against a plain-PyTorch reference model with the same weights.

The reference is written here in plain torch (F.linear, F.layer_norm, the activations' formulas) and
evaluated in float64 from the module's own (dtype-rounded) parameters and input: the exact result
of the maths the module claims to compute. Compared are the output and ALL gradients (input, every
parameter incl. the norm's weight and bias).

Tolerances (tests/tolerances.py): high precision elementwise, rtol of the dtype and an atol of a
couple of its ulps at the tensor's largest magnitude (sums of many terms round relative to their
largest terms, not to a cancelled result); FP8 by the relative norm of the error, below the rtol of
the format the tensor went through (E4M3 forward, E5M2 gradients under HYBRID).

Also here: te.checkpoint vs plain (bit-exact, FP8 included, dropout through the RNG tracker),
fuse_wgrad_accumulation into main_grad vs plain, fp8_model_init vs high-precision weights,
torch.compile(fullgraph=True) vs eager, and state_dict round trips of the FP8 metadata.
"""
import copy
import io
import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from module_cases import (  # noqa: E402
    ACTIVATIONS, DTYPES, GATED, GEMM_MODULES, HAS_NATIVE_GPU, MODULES, NORMALIZATIONS, SHAPES, autocast,
    make_module, spread_cases)
from utils import DEVICES, native_gpu_reason, randn, tols  # noqa: E402

import transformer_engine.pytorch as te  # noqa: E402
from transformer_engine.common import recipe as te_recipe  # noqa: E402

EPS = 1e-5


# ---------------------------------------------------------------------------------------------
# The plain-PyTorch reference model
# ---------------------------------------------------------------------------------------------

def _act(name, x):
    if name == "clamped_swiglu":  # LayerNormMLP's default activation_params: limit 7, alpha 1.702
        a, b = x.chunk(2, dim=-1)
        a = a.clamp(max=7.0)
        return a * torch.sigmoid(1.702 * a) * (b.clamp(-7.0, 7.0) + 1)
    if name in GATED:
        a, gate = x.chunk(2, dim=-1)
        return _act({"geglu": "gelu", "reglu": "relu", "swiglu": "silu", "qgeglu": "qgelu",
                     "sreglu": "srelu", "glu": "sigmoid"}[name], a) * gate
    return {"gelu": lambda v: F.gelu(v, approximate="tanh"),
            "relu": F.relu,
            "qgelu": lambda v: v * torch.sigmoid(1.702 * v),
            "srelu": lambda v: F.relu(v) ** 2,
            "silu": F.silu,
            "sigmoid": torch.sigmoid}[name](x)


def _norm(kind, x, p, prefix, zero_centered_gamma):
    w = p[prefix + "weight"]
    gamma = w + 1 if zero_centered_gamma else w
    if kind == "LayerNorm":
        return F.layer_norm(x, x.shape[-1:], gamma, p[prefix + "bias"], EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * gamma


def reference_forward(module, case, x, p, stored=lambda t: t):
    """The module's maths in plain torch; p: parameter name -> tensor (NVIDIA TE's names).

    `stored` is applied where any implementation keeps an intermediate in the activation dtype
    (norm output, FC1 output, activation output), forward and, through autograd, backward. Without
    it, a value of FC1's output within rounding of 0 could take the other side of relu's kink in
    the reference than in the module, and the gradient comparison would measure that, not a fault.
    """
    zcg = case.get("zero_centered_gamma", False)
    if module == "Linear":
        return F.linear(x, p["weight"], p.get("bias"))
    if module in ("LayerNorm", "RMSNorm"):
        return _norm(module, x, p, "", zcg)
    ln = stored(_norm(case.get("normalization", "LayerNorm"), x, p, "layer_norm_", zcg))
    if module == "LayerNormLinear":
        return F.linear(ln, p["weight"], p.get("bias"))
    h = stored(_act(case.get("activation", "gelu"), stored(F.linear(ln, p["fc1_weight"], p.get("fc1_bias")))))
    return F.linear(h, p["fc2_weight"], p.get("fc2_bias"))


def reference_grads(module, case, m, x, dy, fp8=False):
    """(output, {name: grad}) of the reference in float64 from the module's parameters; in high
    precision the intermediates are rounded to the module's dtype where the module stores them
    (FP8 cases are judged against the unrounded maths by norm)."""
    p = {n: t.detach().to(torch.float64).requires_grad_() for n, t in _hp_params(m).items()}
    xd = x.detach().to(torch.float64).requires_grad_()
    dtype = x.dtype

    def stored(t):
        return t if fp8 else t.to(dtype).to(torch.float64)
    out = reference_forward(module, case, xd, p, stored)
    out.backward(dy.to(torch.float64))
    grads = {n: t.grad for n, t in p.items()}
    grads["input"] = xd.grad
    return out.detach(), grads


def _hp_params(m):
    """Parameters as high-precision tensors (a Float8Tensor weight reads as its dequantised value)."""
    out = {}
    for n, t in m.named_parameters():
        t = t.detach()
        if isinstance(t, te.Float8Tensor):
            t = t.dequantize()
        out[n] = t
    return out


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------

def assert_close_hp(got, want, dtype, what):
    """Elementwise: |got - want| <= rtol |want| + atol + 2 rtol max|want| (dtype's rtol/atol)."""
    t = tols(dtype)
    want = want.to(torch.float64).cpu()
    got = got.detach().to(torch.float64).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    peak = want.abs().max().item() if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=t["rtol"], atol=t["atol"] + 2 * t["rtol"] * peak,
                               msg=lambda m: f"{what} ({dtype}): {m}")


# activations with a kink (a derivative that jumps at a point): where a 16-bit GEMM output lands
# within one rounding of the kink, two valid roundings pick different sides, and the gradients
# that flow through that element differ by O(1)
KINKED = ("relu", "reglu", "srelu", "sreglu", "clamped_swiglu")


def assert_close_hp_kinked(got, want, dtype, what):
    """For gradients through a kinked activation in 16 bits: elementwise as assert_close_hp except
    for at most 0.1% of the elements, and the whole within twice the dtype's rtol by norm. One
    flipped element changes a whole row of FC1's input gradient by O(1), and the reductions over
    the tokens (the norm's weight and bias) carry that into every one of their elements: on the
    odd shape (few tokens) one flip alone moved the RMSNorm weight's gradient by 1.7% (H100)."""
    t = tols(dtype)
    want = want.to(torch.float64).cpu()
    got = got.detach().to(torch.float64).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    peak = want.abs().max().item() if want.numel() else 0.0
    off = (got - want).abs() > t["rtol"] * want.abs() + t["atol"] + 2 * t["rtol"] * peak
    assert off.sum().item() <= max(1, want.numel() // 1000), (
        f"{what} ({dtype}): {off.sum().item()} of {want.numel()} elements outside the tolerance")
    rel = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert rel <= 2 * t["rtol"], f"{what} ({dtype}): norm-relative error {rel:.4f} > {2 * t['rtol']}"


def assert_close_fp8(got, want, fmt, what):
    """||got - want|| / ||want|| <= rtol of the FP8 format (`fmt`: 'float8_e4m3'/'float8_e5m2')."""
    want = want.to(torch.float64).cpu()
    got = got.detach().to(torch.float64).cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err <= tols(fmt)["rtol"], f"{what}: relative error {err:.4f} > {tols(fmt)['rtol']} ({fmt})"


def _module_grads(m, x):
    grads = {n: p.grad for n, p in m.named_parameters()}
    grads["input"] = x.grad
    return grads


# ---------------------------------------------------------------------------------------------
# Module vs reference
# ---------------------------------------------------------------------------------------------

def _numerics_cases(device):
    full = device == "cuda"
    params = []
    for module in MODULES:
        axes = {"dtype": tuple(DTYPES), "shape": ("small", "odd")}
        if module in GEMM_MODULES:
            axes.update(recipe=("none", "delayed", "current"), bias=(True, False))
        else:
            axes["recipe"] = ("none",)
        if module != "Linear":
            axes["zero_centered_gamma"] = (False, True)
        if module in ("LayerNormLinear", "LayerNormMLP"):
            axes["normalization"] = NORMALIZATIONS
        if module == "LayerNormMLP":
            axes["activation"] = ACTIVATIONS
        core = {"LayerNormMLP": ("dtype", "recipe", "activation", "normalization") if full
                else ("recipe", "activation", "normalization"),
                "LayerNormLinear": ("dtype", "recipe", "normalization", "zero_centered_gamma") if full
                else ("dtype", "recipe")}.get(module, ("dtype", "recipe", "shape") if full else ("dtype", "recipe"))
        for case in spread_cases(axes, core, f"numerics-{module}-{device}"):
            if case["recipe"] != "none":
                case["shape"] = "small"  # FP8 needs dims that are multiples of 16
            ident = "-".join(str(case[k]) for k in sorted(case))
            params.append(pytest.param(device, module, case, id=f"{device}-{module}-{ident}"))
    return params


def _all_numerics_cases():
    cases = _numerics_cases("cpu")
    if HAS_NATIVE_GPU:
        cases += _numerics_cases("cuda")
    else:
        cases.append(pytest.param("cuda", None, None, id="cuda-all",
                                  marks=pytest.mark.skip(reason=native_gpu_reason())))
    return cases


def _run(m, module, x, dy, recipe_name, steps=1):
    """steps forward+backward calls under the recipe; the gradients are those of the last one."""
    for _ in range(steps):
        m.zero_grad(set_to_none=True)
        x.grad = None
        with autocast(recipe_name):
            out = m(x)
        out.backward(dy)
    return out


def _case_module(device, module, case, dtype, shape, **extra):
    options = {k: case[k] for k in ("bias", "normalization", "activation", "zero_centered_gamma") if k in case}
    return make_module(module, shape, dtype, device, **options, **extra)


def _randomise_norm_params(m):
    """Norm weights start at 1 (0 with zero_centered_gamma) and biases at 0: draw them instead, so
    a swapped or ignored parameter shows."""
    with torch.no_grad():
        for i, (n, p) in enumerate(m.named_parameters()):
            if n.startswith("layer_norm_") or n in ("weight", "bias") and isinstance(m, (te.LayerNorm, te.RMSNorm)):
                base = 0.0 if n.endswith("bias") or getattr(m, "zero_centered_gamma", False) else 1.0
                p.copy_(base + 0.3 * randn(p.shape, torch.float32, "cpu", seed=100 + i).to(p.device, p.dtype))
            elif n.endswith("bias"):
                p.copy_(0.5 * randn(p.shape, torch.float32, "cpu", seed=100 + i).to(p.device, p.dtype))


@pytest.mark.parametrize("device,module,case", _all_numerics_cases())
def test_module_matches_reference(device, module, case):
    dtype = DTYPES[case["dtype"]]
    shape = SHAPES[case["shape"]]
    torch.manual_seed(99)
    m = _case_module(device, module, case, dtype, shape)
    _randomise_norm_params(m)
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=11).requires_grad_()
    out_features = shape.ffn if module in ("Linear", "LayerNormLinear") else shape.hidden
    dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=12)
    # delayed scaling starts from scale 1: let the amax history fill before judging it
    out = _run(m, module, x, dy, case["recipe"], steps=3 if case["recipe"] == "delayed" else 1)
    want, want_grads = reference_grads(module, case, m, x, dy, fp8=case["recipe"] != "none")
    grads = _module_grads(m, x)
    if case["recipe"] == "none":
        assert_close_hp(out, want, dtype, f"{module} output")
        for n, g in want_grads.items():
            assert grads[n] is not None, f"{module}: no gradient for {n}"
            check = (assert_close_hp_kinked if case.get("activation") in KINKED and dtype != torch.float32
                     else assert_close_hp)
            check(grads[n], g, dtype, f"{module} grad of {n}")
    else:
        assert_close_fp8(out, want, "float8_e4m3", f"{module} output")
        for n, g in want_grads.items():
            assert grads[n] is not None, f"{module}: no gradient for {n}"
            assert_close_fp8(grads[n], g, "float8_e5m2", f"{module} grad of {n}")


# ---------------------------------------------------------------------------------------------
# Residual connections in the GEMM (TransformerLayer's internal _residual / _add_input)
# ---------------------------------------------------------------------------------------------

def _residual_step(m, module, x, r, dy, recipe_name, fused, steps):
    """out and the gradients of `r + m(x)` (Linear) or `x + m(x)` (LayerNormMLP), fused into the
    module's GEMM or added after it; delayed scaling runs `steps` steps to fill its history."""
    for _ in range(steps):
        m.zero_grad(set_to_none=True)
        x.grad = None
        if r is not None:
            r.grad = None
        with autocast(recipe_name):
            if module == "Linear":
                out = m(x, _residual=r) if fused else r + m(x)
            else:
                out = m(x, _add_input=True) if fused else x + m(x)
        out.backward(dy)
    grads = _module_grads(m, x)
    if r is not None:
        grads["residual"] = r.grad
    return out, grads


def _residual_cases():
    """(device, recipe) pairs: high precision on every device, FP8 where FP8 GEMMs run."""
    gpu = [p for p in DEVICES if not isinstance(p, str)]
    return ([("cpu", "none")] + [pytest.param(p.values[0], r, marks=p.marks, id=f"cuda-{r}")
                                 for p in gpu for r in ("none", "delayed", "current")])


@pytest.mark.parametrize("device,recipe_name", _residual_cases())
@pytest.mark.parametrize("module", ["Linear", "LayerNormMLP"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_residual_in_gemm_matches_separate_add(device, recipe_name, module, dtype):
    """The residual added by the GEMM (its C operand; LayerNormMLP's gradient by the norm
    backward) gives the separate add's output and gradients: one rounding fewer, so within the
    dtype's tolerance (FP8: the same FP8 operands, so high-precision tolerances still apply)."""
    shape = SHAPES["small"]
    torch.manual_seed(7)
    fused_m = make_module(module, shape, dtype, device)
    _randomise_norm_params(fused_m)
    plain_m = copy.deepcopy(fused_m)
    out_features = shape.ffn if module == "Linear" else shape.hidden
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=31).requires_grad_()
    r = (randn((shape.batch, shape.seq, out_features), dtype, device, seed=32, scale=4.0)
         .requires_grad_() if module == "Linear" else None)
    dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=33)
    steps = 3 if recipe_name == "delayed" else 1
    out, grads = _residual_step(fused_m, module, x, r, dy, recipe_name, True, steps)
    want, want_grads = _residual_step(plain_m, module, x, r, dy, recipe_name, False, steps)
    assert out.dtype == want.dtype == dtype
    assert_close_hp(out, want, dtype, f"{module} output with the residual")
    for n, g in want_grads.items():
        assert grads[n] is not None, f"{module}: no gradient for {n}"
        assert_close_hp(grads[n], g, dtype, f"{module} grad of {n} with the residual")
    if r is not None:  # the residual's gradient is the output's, passed through
        assert torch.equal(grads["residual"], dy)


@pytest.mark.parametrize("device", DEVICES)
def test_residual_in_gemm_keeps_type_promotion_and_refuses_what_it_cannot_fuse(device):
    shape = SHAPES["small"]
    lin = make_module("Linear", shape, torch.bfloat16, device)
    x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=1)
    r32 = randn((shape.batch, shape.seq, shape.ffn), torch.float32, device, seed=2)
    out = lin(x, _residual=r32)  # fp32 residual + bf16 output: torch's promotion, added after
    assert out.dtype == torch.float32
    assert_close_hp(out, r32 + lin(x), torch.bfloat16, "Linear output with an fp32 residual")
    with pytest.raises(ValueError, match="Linear: _residual needs"):
        lin(x, _residual=r32[:, :1])
    biased = make_module("Linear", shape, torch.bfloat16, device, return_bias=True)
    with pytest.raises(ValueError, match="Linear: _residual needs"):
        biased(x, _residual=r32.bfloat16())
    mlp = make_module("LayerNormMLP", shape, torch.bfloat16, device, return_layernorm_output=True)
    with pytest.raises(ValueError, match="LayerNormMLP: _add_input needs"):
        mlp(x, _add_input=True)


# ---------------------------------------------------------------------------------------------
# te.checkpoint vs plain: bit-exact
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("recipe_name", ["none", "delayed", "current"])
def test_checkpoint_bit_exact(device, module, recipe_name):
    shape = SHAPES["small"]
    dtype = torch.bfloat16
    torch.manual_seed(5)
    plain = make_module(module, shape, dtype, device)
    ckpt = copy.deepcopy(plain)
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=21)
    out_features = shape.ffn if module != "LayerNormMLP" else shape.hidden
    for step in range(3):  # several steps: delayed scaling's scales move between them
        dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=30 + step)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        plain.zero_grad(set_to_none=True)
        ckpt.zero_grad(set_to_none=True)
        with autocast(recipe_name):
            ya = plain(xa)
        ya.backward(dy)
        with autocast(recipe_name):
            yb = te.checkpoint(ckpt, xb)
        yb.backward(dy)
        assert torch.equal(ya, yb), f"step {step}: checkpointed output differs"
        assert torch.equal(xa.grad, xb.grad), f"step {step}: checkpointed input grad differs"
        for (n, pa), (_, pb) in zip(plain.named_parameters(), ckpt.named_parameters()):
            assert torch.equal(pa.grad, pb.grad), f"step {step}: checkpointed grad of {n} differs"


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_with_dropout_through_rng_tracker(device):
    """Dropout inside a tracker fork: the recompute must draw the same mask."""
    shape = SHAPES["small"]
    dtype = torch.float32
    torch.manual_seed(6)
    lin = make_module("Linear", shape, dtype, device)
    tracker = te.CudaRNGStatesTracker(device="cuda" if device == "cuda" else "cpu")
    tracker.add("model-parallel-rng", 4321)

    def block(inp):
        y = lin(inp)
        with tracker.fork():
            return F.dropout(y, p=0.5, training=True)

    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=22)
    dy = randn((shape.batch, shape.seq, shape.ffn), dtype, device, seed=23)
    states = tracker.get_states()
    xa = x.clone().requires_grad_()
    ya = block(xa)
    ya.backward(dy)
    ga = lin.weight.grad.clone()
    lin.zero_grad(set_to_none=True)

    tracker.set_states(states)
    xb = x.clone().requires_grad_()
    yb = te.checkpoint(block, xb, distribute_saved_activations=False,
                       get_rng_state_tracker=lambda: tracker, tp_group=None)
    # draw from the generators between forward and recompute: the recompute must not see it
    torch.rand(7, device=device)
    with tracker.fork():
        torch.rand(7, device=device)
    yb.backward(dy)
    assert (ya == 0).any() and not (ya == 0).all(), "dropout did nothing"
    assert torch.equal(ya, yb)
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(ga, lin.weight.grad)


# ---------------------------------------------------------------------------------------------
# is_first_microbatch: the FP8 weight is cast once per step and reused
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("recipe_name", ["delayed", "current"])
def test_first_microbatch_caches_fp8_weight(device, module, recipe_name):
    """After is_first_microbatch=True, calls with False reuse the cached FP8 weight even if the
    high-precision weight changed (the contract that lets gradient accumulation skip the cast);
    True or None cast afresh."""
    shape = SHAPES["small"]
    dtype = torch.bfloat16
    torch.manual_seed(12)
    m = make_module(module, shape, dtype, device)
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=28)

    def call(first):
        with torch.no_grad(), autocast(recipe_name):
            return m(x, is_first_microbatch=first).float()
    y_first = call(True)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in ("weight", "fc1_weight", "fc2_weight"):
                p.copy_(p.roll(1, 0))  # other weights, same amax: delayed scales stay valid
    y_cached = call(False)
    y_recast = call(True)
    y_fresh = call(None)
    changed = (y_recast - y_first).norm()
    assert changed > 0.2 * y_first.norm(), "changing the weights hardly changed the output"
    if recipe_name == "current":
        assert torch.equal(y_cached, y_first), "is_first_microbatch=False did not reuse the FP8 weight"
    else:  # the input's delayed scale may move between calls; the weight's did not
        assert (y_cached - y_first).norm() < 0.1 * changed, "is_first_microbatch=False did not reuse the FP8 weight"
    assert_close_fp8(y_fresh, y_recast, "float8_e4m3", f"{module} fresh cast vs is_first_microbatch=True")


# ---------------------------------------------------------------------------------------------
# fuse_wgrad_accumulation: main_grad += wgrad
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recipe_name", ["none", "current"])
def test_fuse_wgrad_accumulation(device, module, dtype, recipe_name):
    shape = SHAPES["small"]
    torch.manual_seed(7)
    plain = make_module(module, shape, dtype, device)
    fused = make_module(module, shape, dtype, device, fuse_wgrad_accumulation=True)
    fused.load_state_dict(plain.state_dict())
    gemm_weights = [n for n, _ in fused.named_parameters() if n in ("weight", "fc1_weight", "fc2_weight")]
    start = {}
    for i, n in enumerate(gemm_weights):
        p = getattr(fused, n)
        start[n] = randn(p.shape, torch.float32, device, seed=40 + i)
        p.main_grad = start[n].clone()
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=24)
    out_features = shape.ffn if module != "LayerNormMLP" else shape.hidden
    dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=25)
    for m in (plain, fused):
        for _ in range(2):  # accumulates over two micro-steps
            with autocast(recipe_name):
                out = m(x.clone().requires_grad_())
            out.backward(dy)
    for n in gemm_weights:
        got = getattr(fused, n).main_grad - start[n]
        want = getattr(plain, n).grad.float()
        if recipe_name == "none":
            assert_close_hp(got, want, dtype, f"{module} main_grad of {n}")
        else:  # the same FP8 GEMM, written in fp32 instead of the weight dtype
            assert_close_hp(got, want, dtype, f"{module} main_grad of {n} (FP8)")
        assert getattr(fused, n).main_grad.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# fp8_model_init: FP8-only weights vs high-precision weights holding the same values
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("recipe_name", ["delayed", "current"])
def test_fp8_model_init_matches_high_precision(device, module, recipe_name):
    shape = SHAPES["small"]
    dtype = torch.bfloat16
    torch.manual_seed(8)
    r = te_recipe.DelayedScaling() if recipe_name == "delayed" else te_recipe.Float8CurrentScaling()
    with te.fp8_model_init(enabled=True, recipe=r):
        q = make_module(module, shape, dtype, device)
    hp = make_module(module, shape, dtype, device)
    fp8_names = [n for n, p in q.named_parameters() if isinstance(p, te.Float8Tensor)]
    want_names = {"weight", "fc1_weight", "fc2_weight"} & {n for n, _ in q.named_parameters()}
    assert set(fp8_names) == want_names, f"FP8 parameters {fp8_names}, expected {sorted(want_names)}"
    with torch.no_grad():
        for n, p in q.named_parameters():
            getattr(hp, n).copy_(p.dequantize() if isinstance(p, te.Float8Tensor) else p)
    for n in fp8_names:
        p = getattr(q, n)
        assert p.dtype == dtype, f"{n}: nominal dtype {p.dtype}, expected {dtype}"
        # the stored data is one byte per element: no high-precision copy hides behind it
        data = getattr(p, "_data", None)
        if data is not None:
            assert data.element_size() == 1
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=26)
    out_features = shape.ffn if module != "LayerNormMLP" else shape.hidden
    dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=27)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    steps = 3 if recipe_name == "delayed" else 1
    ya = _run(q, module, xa, dy, recipe_name, steps)
    yb = _run(hp, module, xb, dy, recipe_name, steps)
    # same weight values, both quantised: only scale choices may differ
    assert_close_fp8(ya, yb, "float8_e4m3", f"{module} fp8_model_init output")
    assert_close_fp8(xa.grad, xb.grad, "float8_e5m2", f"{module} fp8_model_init input grad")
    for n, p in q.named_parameters():
        assert p.grad is not None, f"{n} has no gradient under fp8_model_init"
        assert_close_fp8(p.grad, getattr(hp, n).grad, "float8_e5m2", f"{module} fp8_model_init grad of {n}")


# ---------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) vs eager
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("recipe_name", ["none", "current"], ids=["bf16", "fp8_current"])
def test_compiled_matches_eager(device, module, recipe_name):
    """torch.compile(module, fullgraph=True) called inside fp8_autocast, as users write it;
    fullgraph=True fails on any graph break. On CPU the graph runs with aot_eager (tracing and AOT
    autograd, no code generation: inductor on 2 CI cores would dominate the suite); on the GPU with
    inductor."""
    import torch._dynamo
    torch._dynamo.reset()
    shape = SHAPES["small"]
    dtype = torch.bfloat16
    torch.manual_seed(9)
    eager = make_module(module, shape, dtype, device)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="inductor" if device == "cuda" else "aot_eager")
    out_features = shape.ffn if module != "LayerNormMLP" else shape.hidden
    for i in range(2):
        x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=50 + i)
        dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=60 + i)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
        with autocast(recipe_name):
            ya = eager(xa)
        ya.backward(dy)
        with autocast(recipe_name):
            yb = compiled(xb)
        yb.backward(dy)
        assert_close_hp(yb, ya, dtype, f"compiled {module} output")
        assert_close_hp(xb.grad, xa.grad, dtype, f"compiled {module} input grad")
        for (n, pa), (_, pb) in zip(eager.named_parameters(), twin.named_parameters()):
            assert_close_hp(pb.grad, pa.grad, dtype, f"compiled {module} grad of {n}")


# ---------------------------------------------------------------------------------------------
# state_dict: FP8 metadata round trip, checkpoints without it
# ---------------------------------------------------------------------------------------------

def _train_delayed(m, shape, device, steps=3, seed=70):
    for i in range(steps):
        x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=seed + i, scale=1 + i)
        with autocast("delayed"):
            out = m(x.requires_grad_())
        out.float().square().mean().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
def test_state_dict_round_trips_fp8_metadata(device, module):
    shape = SHAPES["small"]
    torch.manual_seed(10)
    trained = make_module(module, shape, torch.bfloat16, device)
    _train_delayed(trained, shape, device)
    buf = io.BytesIO()
    torch.save(trained.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)  # the default of torch.load: metadata must be plain data

    restored = make_module(module, shape, torch.bfloat16, device)
    restored.load_state_dict(sd, strict=True)
    fresh = make_module(module, shape, torch.bfloat16, device)
    fresh.load_state_dict({k: v for k, v in sd.items() if not k.endswith("_extra_state")}, strict=False)

    x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=80, scale=3.0)
    outs = {}
    for name, m in (("trained", trained), ("restored", restored), ("fresh", fresh)):
        with torch.no_grad(), autocast("delayed"):
            outs[name] = m(x)
    assert torch.equal(outs["restored"], outs["trained"]), "restored FP8 metadata gives another output"
    # the metadata matters: without it the delayed scales start over and the output differs
    assert not torch.equal(outs["fresh"], outs["trained"]), "FP8 metadata made no difference"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
def test_load_checkpoint_saved_without_fp8_metadata(device, module):
    shape = SHAPES["small"]
    torch.manual_seed(11)
    source = make_module(module, shape, torch.bfloat16, device)
    # a checkpoint with weights only, as torch.nn or an older version would have written it
    weights_only = {k: v for k, v in source.state_dict().items() if not k.endswith("_extra_state")}
    target = make_module(module, shape, torch.bfloat16, device)
    _train_delayed(target, shape, device)  # has FP8 metadata of its own
    result = target.load_state_dict(weights_only, strict=True)
    assert not result.unexpected_keys and not result.missing_keys
    for n, p in target.named_parameters():
        assert torch.equal(p, getattr(source, n)), f"{n} not loaded"
    # and it runs under FP8 afterwards, close to the reference from the loaded weights
    x = randn((shape.batch, shape.seq, shape.hidden), torch.bfloat16, device, seed=90)
    with torch.no_grad(), autocast("current"):
        got = target(x)
    with torch.no_grad():
        want = source(x)
    assert_close_fp8(got, want, "float8_e4m3", f"{module} after loading a weights-only checkpoint")


# ---------------------------------------------------------------------------------------------
# Recipes: formats, calibration
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
@pytest.mark.parametrize("fmt", ["E4M3", "HYBRID"])
@pytest.mark.parametrize("recipe_cls", ["DelayedScaling", "Float8CurrentScaling"])
def test_fp8_formats_match_reference(device, module, fmt, recipe_cls):
    """E4M3 everywhere vs HYBRID (E4M3 forward, E5M2 gradients): each within its formats' tolerance."""
    shape = SHAPES["small"]
    dtype = torch.bfloat16
    torch.manual_seed(13)
    m = make_module(module, shape, dtype, device)
    _randomise_norm_params(m)
    r = getattr(te_recipe, recipe_cls)(fp8_format=getattr(te_recipe.Format, fmt))
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=31).requires_grad_()
    out_features = shape.ffn if module != "LayerNormMLP" else shape.hidden
    dy = randn((shape.batch, shape.seq, out_features), dtype, device, seed=32)
    for _ in range(3 if recipe_cls == "DelayedScaling" else 1):
        m.zero_grad(set_to_none=True)
        x.grad = None
        with te.fp8_autocast(enabled=True, fp8_recipe=r):
            out = m(x)
        out.backward(dy)
    want, want_grads = reference_grads(module, {}, m, x, dy, fp8=True)
    grads = _module_grads(m, x)
    assert_close_fp8(out, want, "float8_e4m3", f"{module} {fmt} output")
    bwd = "float8_e4m3" if fmt == "E4M3" else "float8_e5m2"
    for n, g in want_grads.items():
        assert_close_fp8(grads[n], g, bwd, f"{module} {fmt} grad of {n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", GEMM_MODULES)
def test_calibration_runs_high_precision_and_sets_scales(device, module):
    """calibrating=True: outputs are the high-precision ones bit for bit, and the amaxes it records
    give the first FP8 step of delayed scaling proper scales. GEMM inputs of magnitude 1e-3 make
    the difference: with the initial scale of 1 they fall in E4M3's subnormals."""
    shape = SHAPES["small"]
    dtype = torch.float32
    torch.manual_seed(14)
    calibrated = make_module(module, shape, dtype, device)
    if module != "Linear":  # the norm rescales its input: make its output small instead
        with torch.no_grad():
            calibrated.layer_norm_weight.mul_(1e-3)
    uncalibrated = copy.deepcopy(calibrated)
    x = randn((shape.batch, shape.seq, shape.hidden), dtype, device, seed=33, scale=1e-3)
    r = te_recipe.DelayedScaling()
    with torch.no_grad():
        plain = calibrated(x)
        with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=r):
            calib_out = calibrated(x)
        assert torch.equal(calib_out, plain), "calibration changed the high-precision output"
        with te.fp8_autocast(enabled=True, fp8_recipe=r):
            good = calibrated(x)
            bad = uncalibrated(x)
    err_good = ((good - plain).norm() / plain.norm()).item()
    err_bad = ((bad - plain).norm() / plain.norm()).item()
    assert err_good <= tols("float8_e4m3")["rtol"], f"calibrated first FP8 step: relative error {err_good:.3f}"
    assert err_bad > 2 * err_good, f"calibration made no difference ({err_bad:.3f} vs {err_good:.3f})"
