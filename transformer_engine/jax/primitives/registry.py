"""When a JAX primitive runs as an XLA FFI custom call, and the plumbing shared by all of them.

A primitive uses its custom call when (checked at trace time, i.e. each time a function is
traced by jit):
  - the _native_jax module of this install imports (built where JAX was installed),
  - the native library sees a GPU of its backend, JAX's default backend is 'gpu' and no
    jax.default_device(...) of another platform is in force,
  - NVTE_JAX_CUSTOM_CALLS (read in transformer_engine.common.config) leaves it on,
  - no mesh of more than one device is in force (`with mesh:`, jax.set_mesh): the custom calls
    have no partitioning rule, so under a mesh the jnp ops run and XLA partitions them.
Otherwise the jnp reference of transformer_engine.jax.kernels runs: on CPU, and as the oracle.

vmap: every custom call is declared with vmap_method="sequential": a batched call runs the
custom call once per batch element (a loop in XLA), which keeps per-tensor semantics such as
the amax of an FP8 cast exact. It is correct, not fast; vmap over a large batch of small calls
is better written as one call on the stacked array.
"""
from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np

from ...common import config
from ...common.capabilities import native_device_capability
from ...common.native import build_backend, native_module
from ..sharding import mesh_device_count

_PLATFORMS = {"cuda": "CUDA", "rocm": "ROCM"}

# Any non-null, well aligned address: size queries read shapes and dtypes, never the data.
_QUERY_PTR = 1 << 12


@functools.lru_cache(maxsize=None)
def _load_handlers():
    """Imports _native_jax and registers its handlers for this build's platform, once."""
    try:
        mod = importlib.import_module("transformer_engine._native_jax")
    except ImportError as exc:
        return None, f"_native_jax not importable ({exc})"
    platform = _PLATFORMS.get(build_backend() or "")
    if platform is None:
        return None, "native library has no GPU backend"
    for name, capsule in mod.handlers().items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
    return mod, ""


@functools.lru_cache(maxsize=None)
def _native_device_reason() -> str:
    cap = native_device_capability()
    if cap.backend not in _PLATFORMS:
        return f"no native device ({cap.reason})"
    return ""


def why_reference(op: str) -> str:
    """'' when `op` runs as a custom call now, else why the jnp reference runs."""
    if not config.jax_custom_call_enabled(op):
        return f"NVTE_JAX_CUSTOM_CALLS turns {op} off"
    if jax.default_backend() != "gpu":
        return f"JAX's default backend is {jax.default_backend()}"
    # The custom calls carry no partitioning rule: under a mesh XLA would gather their sharded
    # operands onto every device (and an amax would be of one shard's data only where a caller
    # shard_maps); the jnp ops partition like any XLA op, with the amax reduced across devices
    devices = mesh_device_count()
    if devices > 1:
        return f"a mesh of {devices} devices is in force (the custom calls have no partitioning rule)"
    # Under `with jax.default_device(cpu_device):` the computation runs on the host.
    device = jax.config.jax_default_device
    platform = getattr(device, "platform", device)
    if platform is not None and str(platform).lower() not in ("gpu", "cuda", "rocm"):
        return f"the default device is {device}"
    mod, why = _load_handlers()
    if mod is None:
        return why
    return _native_device_reason()


def use_custom_call(op: str) -> bool:
    return why_reference(op) == ""


def ffi(name: str, results, *, aliases=None):
    """jax.ffi.ffi_call of handler `name` (registered by _load_handlers)."""
    return jax.ffi.ffi_call(name, results, input_output_aliases=aliases or None,
                            vmap_method="sequential")


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), jnp.dtype(dtype))


def empty(dtype=jnp.float32):
    """Placeholder for an optional operand the handler ignores."""
    return jnp.zeros((0,), dtype)


def f32(v) -> np.float32:
    return np.float32(v)


def i64(v) -> np.int64:
    return np.int64(int(v))


def scalar1(v):
    """An FP8 scale (scalar or [1]) as the [1] float32 operand the handlers take."""
    return jnp.asarray(v, jnp.float32).reshape(1)


_DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float8_e4m3fn": 3, "float8_e4m3fnuz": 3,
               "float8_e5m2": 4, "float8_e5m2fnuz": 4, "int32": 5, "int64": 6, "uint8": 7,
               "bool": 7}


def query_descriptor(shape, dtype, fp8_meta: bool = False) -> tuple:
    """A _native descriptor with a placeholder address, for the core's workspace-size queries."""
    ptr = _QUERY_PTR if int(np.prod(shape)) else 0
    meta = _QUERY_PTR if fp8_meta else 0
    return (ptr, tuple(int(d) for d in shape), _DTYPE_CODE[jnp.dtype(dtype).name], meta, meta, meta)


def native():
    """The _native pybind module (size queries)."""
    return native_module()
