"""The modules' eager native branches (the unchecked calls of kernels/<family>.py, the fused
Linear step of kernels/linear_step.py, the choosers of library/) run only where the native core
serves the tensors. Here a stand-in native module that launches nothing takes every call, so that
those branches run on any machine: each module, recipe and option goes through forward and
backward without an exception, and every call hands the bindings plain numbers, tuples and lists
(never tensors). The numbers the stand-in returns are meaningless: the GPU suites check values."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import native
from transformer_engine.pytorch import quantization as q
from transformer_engine.pytorch.kernels import activation, cast, eager, normalization

H, F, T = 64, 96, 48
PLAIN = (int, float, bool, tuple, list, type(None))


def _plain(args):
    bad = [a for a in args if not isinstance(a, PLAIN)]
    assert not bad, f"a binding was handed {[type(a).__name__ for a in bad]}"


# the names of the stand-in plan's calls, in order (cleared per test by the stand_in fixture)
PLAN_CALLS: list = []


class _Plan:
    """Stands in for LinearFp8Plan: its sizes, and the argument counts of its calls."""

    def __init__(self, tokens, in_features, out_features, dtype, w_dtype, wq_dtype, fp8_fwd,
                 fp8_bwd, fresh_w, need_dgrad, need_wgrad, dbias_dtype, delayed, s_fwd, s_bwd):
        _plain((tokens, in_features, out_features, dtype, w_dtype, wq_dtype, fp8_fwd, fp8_bwd,
                fresh_w, need_dgrad, need_wgrad, dbias_dtype, delayed, s_fwd, s_bwd))
        assert len(s_fwd) == len(s_bwd) == 6
        self.tokens, self.in_features, self.out_features = tokens, in_features, out_features
        self.fresh_w, self.need_dgrad, self.need_wgrad = fresh_w, need_dgrad, need_wgrad
        self.dbias_in_cast = dbias_dtype >= 0
        self.kept_bytes = self.forward_scratch_bytes = self.backward_scratch_bytes = 4096
        self.regions = {}

    def forward(self, *args):
        assert len(args) == 9
        _plain(args)
        PLAN_CALLS.append("forward")

    def backward(self, *args):
        assert len(args) == 14
        _plain(args)
        assert args[0] and args[6]  # dy, scratch
        PLAN_CALLS.append("backward")

    def backward_fp8_grad(self, *args):
        assert len(args) == 13
        _plain(args)
        assert args[0] and args[2]  # dyq, dy_sinv
        assert not self.dbias_in_cast
        assert bool(args[1]) == bool(self.need_wgrad)  # dyq_t exactly when there is a dw to make
        PLAN_CALLS.append("backward_fp8_grad")


class _Native:
    LinearFp8Plan = _Plan

    def __getattr__(self, name):
        def call(*args, **kwargs):
            _plain(args)
            if name.endswith("_workspace"):
                return (16,)
            if name in ("rmsnorm_bwd", "layernorm_bwd"):
                return 16  # the workspace query's answer in bytes
            return None
        return call


class _Call:
    def __init__(self):
        self.mod, self.stream, self.ws = _Native(), 0, None
        self.ws_ptr, self.ws_size, self.device = 256, 1 << 20, torch.device("cpu")
        self.env = (self.ws_ptr, self.ws_size, self.stream)


@pytest.fixture
def stand_in(monkeypatch):
    call = _Call()
    monkeypatch.setattr(eager, "native_call", lambda x: call)
    monkeypatch.setattr(eager, "native_call_again", lambda nc, x: nc if nc is not None else call)
    monkeypatch.setattr(native, "native_for_torch", lambda: call.mod)
    monkeypatch.setattr(native, "stream_handle", lambda index=None: 0)
    monkeypatch.setattr(q.RecipeState, "on_native", lambda self: True)
    monkeypatch.setattr(q, "require_fp8_support", lambda *a: None)
    # the stand-in's workspace answers are kept apart: the native module's, kept per problem,
    # serve the later tests of this process
    for mod, name in ((cast, "_WS_SHAPES"), (activation, "_DBIAS_WS"),
                      (activation, "_DBIAS_DACT_WS"), (normalization, "_NORM_BWD_WS")):
        monkeypatch.setattr(mod, name, {})
    PLAN_CALLS.clear()
    yield call


def test_a_workspace_size_is_kept_per_device():
    """workspace_once asks the native module once per problem on each device: an answer kept
    for one device's module is never handed to another's."""
    asked = []

    class OnDevice:
        def __init__(self, device):
            self.device = torch.device(device)

    def query(shape):
        return lambda: asked.append(shape) or shape
    key = ("test_a_workspace_size_is_kept_per_device", 48, 96)
    try:
        for device, shape in (("cpu", (1, 96)), ("meta", (16,)), ("cpu", (2, 2)), ("meta", (3,))):
            ws = cast.workspace_once(OnDevice(device), key, query(shape))
            assert ws.device.type == device
            assert ws.dtype == torch.float32
        assert asked == [(1, 96), (16,)]  # the later queries were not made
        assert tuple(cast.workspace_once(OnDevice("cpu"), key, query((5,))).shape) == (1, 96)
    finally:
        for device in ("cpu", "meta"):
            cast._WS_SHAPES.pop((torch.device(device), key), None)


def _frozen(m):
    for name, p in m.named_parameters():
        if name.endswith("weight") and "norm" not in name:
            p.requires_grad_(False)
    return m


# the stand-in native module works on CPU tensors: modules on the CPU on any machine
_ON_CPU = dict(params_dtype=torch.bfloat16, device="cpu")
MODULES = {
    "Linear": lambda: te.Linear(H, F, **_ON_CPU),
    "Linear_no_bias": lambda: te.Linear(H, F, bias=False, **_ON_CPU),
    "Linear_main_grad": lambda: te.Linear(H, F, fuse_wgrad_accumulation=True,
                                          **_ON_CPU),
    "LayerNormLinear": lambda: te.LayerNormLinear(H, F, **_ON_CPU),
    "LayerNormLinear_rms": lambda: te.LayerNormLinear(H, F, normalization="RMSNorm",
                                                      return_layernorm_output=True,
                                                      **_ON_CPU),
    "LayerNormLinear_main_grad": lambda: te.LayerNormLinear(H, F, fuse_wgrad_accumulation=True,
                                                            **_ON_CPU),
    "LayerNormLinear_delay_wgrad": lambda: te.LayerNormLinear(H, F, delay_wgrad_compute=True,
                                                              **_ON_CPU),
    # fp32 parameters under torch.autocast: the bias (and its gradient) of another dtype than
    # the compute dtype
    "LayerNormLinear_fp32_params": lambda: te.LayerNormLinear(H, F, params_dtype=torch.float32,
                                                              device="cpu"),
    "LayerNormMLP_gelu": lambda: te.LayerNormMLP(H, F, **_ON_CPU),
    "LayerNormMLP_swiglu": lambda: te.LayerNormMLP(H, F, activation="swiglu",
                                                   **_ON_CPU),
    "LayerNormMLP_relu_rms": lambda: te.LayerNormMLP(H, F, activation="relu", bias=False,
                                                     normalization="RMSNorm",
                                                     **_ON_CPU),
    "LayerNormMLP_main_grad": lambda: te.LayerNormMLP(H, F, fuse_wgrad_accumulation=True,
                                                      **_ON_CPU),
    "LayerNormMLP_delay_wgrad": lambda: te.LayerNormMLP(H, F, delay_wgrad_compute=True,
                                                        **_ON_CPU),
    "LayerNormMLP_fp32_params": lambda: te.LayerNormMLP(H, F, params_dtype=torch.float32,
                                                        device="cpu"),
    # frozen GEMM weights: no weight gradients, so no transposes (the unfused FP8 activations)
    "LayerNormMLP_frozen": lambda: _frozen(te.LayerNormMLP(H, F, activation="gelu",
                                                           **_ON_CPU)),
    "LayerNorm": lambda: te.LayerNorm(H, **_ON_CPU),
    "RMSNorm": lambda: te.RMSNorm(H, **_ON_CPU),
    "GroupedLinear": lambda: te.GroupedLinear(2, H, F, **_ON_CPU),
}
RECIPES = {"bf16": None, "delayed": recipe.DelayedScaling(), "current": recipe.Float8CurrentScaling()}


# is_first_microbatch (True: cast and cache the FP8 weight, False: reuse it) matters to the FP8
# weight casts of the modules that take it
CASES = [(name, rname, mb) for name in MODULES for rname in RECIPES
         for mb in ((None, True, False) if RECIPES[rname] is not None
                    and name not in ("LayerNorm", "RMSNorm", "GroupedLinear") else (None,))]


@pytest.mark.parametrize("name,rname,microbatch", CASES,
                         ids=[f"{n}-{r}-{ {None: 'every_call', True: 'first', False: 'later'}[m]}"
                              for n, r, m in CASES])
def test_eager_native_branches_run(stand_in, name, rname, microbatch):
    r = RECIPES[rname]
    torch.manual_seed(3)
    m = MODULES[name]()
    if name.endswith("_main_grad"):
        for pname, p in m.named_parameters():
            if pname.endswith("weight") and "norm" not in pname:
                p.main_grad = torch.randn(p.shape)
    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    kw = {} if microbatch is None else {"is_first_microbatch": microbatch}
    with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
        out = m(x, [16, T - 16]) if name == "GroupedLinear" else m(x, **kw)
    out = out[0] if isinstance(out, tuple) else out
    keeps_width = name in ("LayerNorm", "RMSNorm") or name.startswith("LayerNormMLP")
    assert out.shape == (T, H if keeps_width else F)
    out.float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    if name.endswith("_delay_wgrad"):
        m.backward_dw()
    # the norm modules' FP8 backward: one call of the Linear step's plan per GEMM (the checked
    # ops for a delayed weight gradient)
    norm_gemm = name.startswith(("LayerNormLinear", "LayerNormMLP"))
    if r is not None and norm_gemm and not name.endswith("_delay_wgrad"):
        want = (["backward"] if name.startswith("LayerNormLinear")
                else ["backward", "backward_fp8_grad"])
        assert [c for c in PLAN_CALLS if c.startswith("backward")] == want
    assert not q._DEFERRED


@pytest.mark.parametrize("recipe_name", ["delayed", "current"])
def test_state_pointers_name_the_state_tensors(recipe_name):
    """The addresses the native eager calls receive for a recipe state are its tensors', per
    direction, with the direction's step counter, and reading them runs no pending update."""
    r = recipe.DelayedScaling() if recipe_name == "delayed" else recipe.Float8CurrentScaling()
    rs = q.RecipeState(r, torch.device("cpu"), 3, 2)
    fwd, bwd = rs.ptrs_fwd, rs.ptrs_bwd
    groups = rs.scaling_groups()
    for ptrs, (h, sc, si, fp8_max, sk), i in ((fwd, groups[0], 0), (bwd, groups[1], 1)):
        assert ptrs == (h.data_ptr(), sc.data_ptr(), si.data_ptr(), fp8_max,
                        rs.counters[i].data_ptr(), sk.data_ptr())
    assert bwd[4] - fwd[4] == rs.counters.element_size()
    assert fwd[3] == rs.fwd_max and bwd[3] == rs.bwd_max
    descs = rs.update_desc(True), rs.update_desc(False)
    for desc, (h, sc, si, fp8_max, sk) in zip(descs, groups):
        assert desc == (h.data_ptr(), sc.data_ptr(), si.data_ptr(), h.shape[0], h.shape[1],
                        float(fp8_max), sk.data_ptr())
