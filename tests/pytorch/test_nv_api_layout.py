"""NVIDIA TE 2.x module paths on this library: pytorch.fp8 (FP8GlobalStateManager, check_*),
tensor / float8_tensor quantizers (bit for bit against the reference cast), constants,
cpp_extensions.general_gemm (against a dequantize-then-matmul reference), distributed
collectives and caller-driven FP8 activation recompute."""
import warnings

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.kernels import dequantize_reference, quantize_reference
from utils import DEVICES, randn

E4M3 = te.DType.kFloat8E4M3
E5M2 = te.DType.kFloat8E5M2


def test_fp8_module_state_manager_follows_autocast():
    from transformer_engine.pytorch.fp8 import FP8GlobalStateManager, fp8_autocast
    assert not FP8GlobalStateManager.is_fp8_enabled()
    r = recipe.DelayedScaling(amax_history_len=4)
    with fp8_autocast(enabled=True, fp8_recipe=r):
        assert FP8GlobalStateManager.is_fp8_enabled()
        assert FP8GlobalStateManager.get_fp8_recipe() is r
        assert FP8GlobalStateManager.get_fp8_group() is None
        assert FP8GlobalStateManager.is_first_fp8_module()
        te.Linear(16, 16, device="cpu")(randn((16, 16), torch.float32, "cpu"))
        assert not FP8GlobalStateManager.is_first_fp8_module()
    assert not FP8GlobalStateManager.is_fp8_enabled()
    assert isinstance(FP8GlobalStateManager.get_fp8_recipe(), recipe.DelayedScaling)
    with te.quantized_model_init(preserve_high_precision_init_val=True):
        assert FP8GlobalStateManager.with_fp8_parameters()
        assert FP8GlobalStateManager.with_high_precision_init_val()
    assert not FP8GlobalStateManager.with_fp8_parameters()


def test_support_checks_have_nv_shapes():
    from transformer_engine.pytorch import fp8
    for fn in (fp8.check_fp8_support, fp8.check_mxfp8_support, fp8.check_fp8_block_scaling_support,
               fp8.check_nvfp4_support):
        ok, why = fn()
        assert isinstance(ok, bool) and isinstance(why, str) and (ok or why)
    assert fp8.check_mxfp8_support()[0] is False
    assert "MXFP8BlockScaling" in fp8.check_mxfp8_support()[1]
    ok = te.is_fp8_available()
    assert isinstance(ok, bool) and te.is_fp8_available(return_reason=True)[0] is ok
    assert te.is_mxfp8_available() is False
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert te.is_fp8_block_scaling_available() is (hopper and te.is_fp8_available())
    with pytest.raises(TypeError, match="return_reason must be a bool"):
        te.is_fp8_available("cpu")


def test_constants_map_dtypes():
    from transformer_engine.pytorch.constants import TE_DType, TE_DType_To_Torch, torch_dtype_of
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        assert TE_DType_To_Torch[TE_DType[dt]] is dt
    assert torch_dtype_of(E4M3) is torch.float8_e4m3fn and torch_dtype_of(torch.int32) is torch.int32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2])
@pytest.mark.parametrize("shape", [(37, 23), (64, 48), (0, 16)])
def test_float8_quantizer_matches_reference(device, fp8_dtype, shape):
    x = randn(shape, torch.float32, device, seed=11, scale=3.0)
    scale = torch.tensor([1.75], device=device)
    amax = torch.full((1,), 0.5, device=device)
    q = te.Float8Quantizer(scale, amax, fp8_dtype, columnwise=False)
    t = q.quantize(x)
    dt = torch.float8_e4m3fn if fp8_dtype == E4M3 else torch.float8_e5m2
    assert isinstance(t, te.QuantizedTensor) and isinstance(t, te.Float8Tensor)
    assert t.shape == x.shape and t.dtype == torch.float32 and t._data.dtype == dt
    if x.numel():
        want, want_sinv, want_amax = quantize_reference(x, scale, dt)
        assert torch.equal(t._data.view(torch.uint8), want.view(torch.uint8))
        assert torch.equal(t._scale_inv, want_sinv)
        assert torch.equal(amax, torch.maximum(torch.full_like(amax, 0.5), want_amax))
        assert torch.equal(t.dequantize(), dequantize_reference(want, want_sinv, torch.float32))
    e = q.make_empty((5, 7), dtype=torch.bfloat16, device=device)
    assert e.shape == (5, 7) and e.dtype == torch.bfloat16 and e._data.dtype == dt
    q.update_quantized(randn((5, 7), torch.bfloat16, device, seed=2), e)
    assert torch.isfinite(e.dequantize()).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("power_2", [False, True])
def test_current_scaling_quantizer_matches_tensor_quantize(device, power_2):
    x = randn((37, 23), torch.bfloat16, device, seed=5, scale=20.0)
    q = te.Float8CurrentScalingQuantizer(E4M3, device, force_pow_2_scales=power_2)
    t = q(x)
    fp8_max = 448.0
    amax = x.float().abs().amax()
    scale = fp8_max / amax
    if power_2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    want, want_sinv, _ = quantize_reference(x, scale.reshape(1).float(), torch.float8_e4m3fn)
    assert torch.equal(t._data.view(torch.uint8), want.view(torch.uint8))
    torch.testing.assert_close(t._scale_inv, want_sinv, rtol=0, atol=0)
    if not power_2:  # Float8Tensor.quantize uses the same rule
        ref = te.Float8Tensor.quantize(x, torch.float8_e4m3fn)
        assert torch.equal(ref._data.view(torch.uint8), t._data.view(torch.uint8))
    eps = te.Float8CurrentScalingQuantizer(E4M3, device, amax_epsilon=1e3)(x)
    assert eps._scale_inv.item() == pytest.approx(1e3 / fp8_max)


def test_quantizer_argument_errors():
    with pytest.raises(TypeError, match="Float8Quantizer: scale must be a one-element float32"):
        te.Float8Quantizer(torch.ones(2), torch.zeros(1), E4M3)
    with pytest.raises(ValueError, match="expected an FP8 type"):
        te.Float8CurrentScalingQuantizer(te.DType.kBFloat16, "cpu")
    with pytest.raises(TypeError, match="quantize: expected a floating-point tensor"):
        te.Float8CurrentScalingQuantizer(E4M3, "cpu")(torch.ones(3, dtype=torch.int32))
    mx = te.MXFP8Quantizer(fp8_dtype=E4M3)  # built up front by configuration code
    with pytest.raises(NotImplementedError, match="MXFP8Quantizer.quantize: MXFP8BlockScaling needs"):
        mx.quantize(torch.ones(32, 32))


def test_float8_tensor_module_paths():
    from transformer_engine.pytorch import float8_tensor, tensor
    assert float8_tensor.Float8Tensor is tensor.Float8Tensor is te.Float8Tensor
    assert issubclass(te.Float8Tensor, tensor.QuantizedTensor)
    assert float8_tensor.Float8Quantizer is te.Float8Quantizer


def _ref_gemm(a, b, layout):
    a = a.dequantize(torch.float32) if isinstance(a, te.QuantizedTensor) else a
    b = b.dequantize(torch.float32) if isinstance(b, te.QuantizedTensor) else b
    opa = a.float().t() if layout[0] == "T" else a.float()
    opb = b.float().t() if layout[1] == "T" else b.float()
    return opb @ opa


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("fp8", [False, True])
def test_general_gemm_nv_signature(device, layout, fp8):
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    m, n, k = 48, 32, 64
    a_shape = (m, k) if layout[0] == "T" else (k, m)
    b_shape = (n, k) if layout[1] == "N" else (k, n)
    a = randn(a_shape, torch.bfloat16, device, seed=1)
    b = randn(b_shape, torch.bfloat16, device, seed=2)
    if fp8:
        q = te.Float8CurrentScalingQuantizer(E4M3, device)
        a, b = q(a), q(b)
    out, bias_grad, gelu_input, extra = general_gemm(a, b, torch.float32, layout=layout)
    assert bias_grad is None and gelu_input is None and extra is None
    assert out.shape == (n, m) and out.dtype == torch.float32
    torch.testing.assert_close(out, _ref_gemm(a, b, layout), rtol=1e-2 if device == "cuda" else 1e-5,
                               atol=1e-2 if device == "cuda" else 1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_general_gemm_bias_gelu_and_bias_grad(device):
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    w = randn((32, 48), torch.float32, device, seed=3)
    x = randn((16, 48), torch.float32, device, seed=4)
    bias = randn((32,), torch.float32, device, seed=5)
    out, _, pre, _ = general_gemm(w, x, layout="TN", bias=bias, gelu=True)
    want_pre = x @ w.t() + bias
    torch.testing.assert_close(pre, want_pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, torch.nn.functional.gelu(want_pre, approximate="tanh"), rtol=1e-5, atol=1e-5)
    dy = randn((16, 32), torch.float32, device, seed=6)
    dw, db, _, _ = general_gemm(x, dy, layout="NT", grad=True, bias=bias)
    torch.testing.assert_close(dw, dy.t() @ x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(db, dy.sum(0), rtol=1e-5, atol=1e-5)
    with pytest.raises(NotImplementedError, match="comm-GEMM overlap"):
        general_gemm(w, x, ub=object())
    with pytest.raises(ValueError, match="layout is 'TT'"):
        general_gemm(w, x, layout="TT")


def test_get_workspace_on_reference_backend():
    from transformer_engine.pytorch.module.base import get_workspace
    ws = get_workspace()
    assert isinstance(ws, torch.Tensor)
    if not torch.cuda.is_available():
        assert ws.numel() == 0


def test_nv_collectives_without_process_group():
    from transformer_engine.pytorch import distributed as ted
    x = randn((6, 5), torch.float32, "cpu", seed=1)
    out, handle = ted.gather_along_first_dim(x, None)
    assert out is x and handle is None
    out, handle = ted.reduce_scatter_along_first_dim(x, None)
    assert out is x and handle is None
    q = te.Float8CurrentScalingQuantizer(E4M3, "cpu")
    out, _ = ted.gather_along_first_dim(x, None, quantizer=q)
    assert isinstance(out, te.Float8Tensor) and torch.equal(out._data, q(x)._data)


def test_get_all_rng_states_covers_every_tracker():
    from transformer_engine.pytorch.distributed import CudaRNGStatesTracker, get_all_rng_states
    a, b = CudaRNGStatesTracker(device="cpu"), CudaRNGStatesTracker(device="cpu")
    a.add("first-state", 101)
    b.add("second-state", 202)
    states = get_all_rng_states()
    assert torch.equal(states["first-state"], a.get_states()["first-state"])
    assert torch.equal(states["second-state"], b.get_states()["second-state"])


@pytest.mark.parametrize("device", DEVICES)
def test_activation_recompute_forward_replays_fp8_scales(device):
    """A checkpoint implemented by the caller (Megatron's pattern): the checkpointed forward runs
    under activation_recompute_forward(recompute_phase=False) without grad; a delayed-scaling
    update changes the scales; the recompute, under recompute_phase=True and an autocast of its
    own, reproduces the forward bit for bit, and its backward finishes the forward's step."""
    from transformer_engine.pytorch import quantization
    from transformer_engine.pytorch.distributed import (
        activation_recompute_forward, in_fp8_activation_recompute_phase,
        is_fp8_activation_recompute_enabled)
    torch.manual_seed(0)
    m = te.Linear(32, 32, device=device)
    r = recipe.DelayedScaling(amax_history_len=2)
    warm = randn((16, 32), torch.float32, device, seed=1)
    with te.fp8_autocast(fp8_recipe=r):
        m(warm).sum().backward()  # scales now come from real amaxes
    x = randn((16, 32), torch.float32, device, seed=2, scale=7.0)
    with te.fp8_autocast(fp8_recipe=r):
        with torch.no_grad(), activation_recompute_forward(activation_recompute=True, recompute_phase=False):
            assert is_fp8_activation_recompute_enabled() and not in_fp8_activation_recompute_phase()
            first = m(x)
        step = quantization.FP8GlobalState.step
    assert not is_fp8_activation_recompute_enabled()
    scale_after = m._fp8_state.scale_fwd.clone()  # the exit's update took x's amax
    with activation_recompute_forward(activation_recompute=True, recompute_phase=True), \
            te.fp8_autocast(fp8_recipe=r):
        assert in_fp8_activation_recompute_phase()
        xr = x.clone().requires_grad_()
        again = m(xr)
    assert torch.equal(again.detach(), first)
    assert step.pending_backward == 1
    again.sum().backward()
    assert step.pending_backward == 0 and step.bwd_done
    assert xr.grad is not None and torch.equal(m._fp8_state.scale_fwd, scale_after)


def test_rope_module_path_with_nv_arguments():
    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
    t = randn((8, 2, 4, 16), torch.float32, "cpu", seed=1)
    freqs = randn((8, 1, 1, 16), torch.float32, "cpu", seed=2)
    want = te.kernels.apply_rotary_pos_emb(t, freqs, "sbhd", True)
    got = apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", interleaved=True, fused=True,
                               cp_size=1, cp_rank=0)
    assert torch.equal(got, want)
    with pytest.raises(NotImplementedError, match="cp_size=2"):
        apply_rotary_pos_emb(t, freqs, cp_size=2, cp_rank=1)


def test_extra_state_module_names_the_unsafe_pickle_variable():
    """The name NVIDIA TE's numerics tests import; extra state here is a dict of tensors, which a
    strict load_state_dict round-trips with the variable unset."""
    import os
    from transformer_engine.pytorch._extra_state import UNSAFE_PICKLE_EXTRA_STATE_ENV
    assert UNSAFE_PICKLE_EXTRA_STATE_ENV == "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
    assert UNSAFE_PICKLE_EXTRA_STATE_ENV not in os.environ
    m = te.Linear(32, 32, device="cpu")
    with te.autocast(recipe=recipe.DelayedScaling()):
        m(randn((16, 32), torch.float32, "cpu", seed=3)).sum().backward()
    state = m.state_dict()
    assert isinstance(state["_extra_state"], dict)
    twin = te.Linear(32, 32, device="cpu")
    twin.load_state_dict(state, strict=True)
    assert torch.equal(twin.get_extra_state()["amax_history_fwd"], state["_extra_state"]["amax_history_fwd"])
