"""torch.compile(fullgraph=True) of the GEMM modules through the torch.library ops: no graph
breaks, results equal to eager (BF16 and Float8CurrentScaling, forward and backward), the
registered ops' fake implementations agree with the real ones, and DelayedScaling under
compile fails with a clear error."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.library import te_ops

from utils import DEVICES, randn


def _modules(device):
    return {
        "Linear": te.Linear(64, 96, params_dtype=torch.bfloat16, device=device),
        "LayerNormLinear": te.LayerNormLinear(64, 96, normalization="RMSNorm",
                                              params_dtype=torch.bfloat16, device=device),
        "LayerNormMLP": te.LayerNormMLP(64, 128, activation="gelu", params_dtype=torch.bfloat16,
                                        device=device),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8_current"])
def test_fullgraph_equals_eager(device, name, fp8):
    torch._dynamo.reset()
    torch.manual_seed(3)
    mod = _modules(device)[name]
    r = recipe.Float8CurrentScaling()

    def step(x):
        with te.autocast(enabled=fp8, recipe=r):
            return mod(x)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x = randn((2, 16, 64), torch.bfloat16, device, seed=1)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = step(xa)
    ga = torch.autograd.grad(ya, [xa] + list(mod.parameters()), torch.ones_like(ya))
    yb = compiled(xb)
    gb = torch.autograd.grad(yb, [xb] + list(mod.parameters()), torch.ones_like(yb))
    assert torch.equal(ya, yb)
    for a, b in zip(ga, gb):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_delayed_scaling_under_compile_is_refused(device):
    torch._dynamo.reset()
    mod = _modules(device)["Linear"]

    def step(x):
        with te.autocast(recipe=recipe.DelayedScaling()):
            return mod(x)

    with pytest.raises(Exception, match="DelayedScaling is not supported under torch.compile"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(randn((16, 64), torch.bfloat16, device))


@pytest.mark.parametrize("device", DEVICES)
def test_fake_implementations_match_real(device):
    """Each op's fake output shapes/dtypes equal its real outputs'."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fp8 = te.fp8_dtype("e4m3", device)
    x = randn((48, 32), torch.bfloat16, device, seed=2)
    w = randn((64, 32), torch.bfloat16, device, seed=3)
    g = randn((32,), torch.bfloat16, device, seed=4)
    scale = torch.ones(1, device=device)
    cases = [
        (te_ops.gemm, (w, x, torch.bfloat16, "TN", None, None, g.new_ones(64), True, None, False, False)),
        (te_ops.gemm, (w, x, torch.bfloat16, "TN", None, None, None, False, None, False, False,
                       randn((48, 64), torch.bfloat16, device, seed=5))),
        (te_ops.cast_transpose, (x, scale, fp8, None)),
        (te_ops.quantize, (x, scale, fp8, None)),
        (te_ops.transpose, (x,)),
        (te_ops.norm_fwd, (x, g, g, 1e-5, False, False, fp8, scale, None)),
        (te_ops.norm_fwd, (x, g, None, 1e-5, True, True, None, None, None)),
        (te_ops.act_fwd, (x, "swiglu", None, None, None)),
        (te_ops.act_bwd, (x[:, :16].contiguous(), x, "swiglu")),
        (te_ops.dbias_dact, (x, x, "gelu")),
        (te_ops.dbias, (x, None)),
        (te_ops.dbias, (x, torch.float32)),
    ]
    for op, args in cases:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        real = real if isinstance(real, (tuple, list)) else (real,)
        fake = fake if isinstance(fake, (tuple, list)) else (fake,)
        for r_, f_ in zip(real, fake):
            assert tuple(r_.shape) == tuple(f_.shape) and r_.dtype == f_.dtype, op


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_addend_under_compile(device):
    """general_gemm(addend=...) traced through te::gemm (fullgraph): the addend rides the op and
    the result equals eager, bit for bit; addend with accumulate=True is refused while tracing."""
    from transformer_engine.pytorch.library import dispatch
    torch._dynamo.reset()
    w = randn((64, 32), torch.bfloat16, device, seed=11)
    x = randn((48, 32), torch.bfloat16, device, seed=12)
    b = randn((64,), torch.bfloat16, device, seed=13)
    r = randn((48, 64), torch.bfloat16, device, seed=14)

    def fn(w, x, b, r):
        res = dispatch.general_gemm(w, x, layout="TN", bias=b, gelu=True, addend=r)
        return res.out, res.gelu_input

    eager = fn(w, x, b, r)
    traced = torch.compile(fn, fullgraph=True, backend="aot_eager")(w, x, b, r)
    for e, t in zip(eager, traced):
        assert torch.equal(e, t)

    def bad(w, x, r):
        return dispatch.general_gemm(w, x, layout="TN", out=torch.zeros_like(r), accumulate=True,
                                     addend=r).out
    torch._dynamo.reset()
    with pytest.raises(Exception, match="addend and accumulate=True are exclusive"):
        torch.compile(bad, fullgraph=True, backend="aot_eager")(w, x, r)
