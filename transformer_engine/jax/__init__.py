"""JAX frontend of Transformer Engine: XLA FFI custom calls over the native core on the GPU
(platforms CUDA and ROCM), the jnp references of `ops` on CPU and wherever
NVTE_JAX_CUSTOM_CALLS turns a primitive off; fp8_autocast/autocast; functional ops; Flax
modules in transformer_engine.jax.flax."""
import jax  # noqa: F401

from ..common import recipe  # noqa: F401
from . import kernels  # noqa: F401
from .fp8 import (FP8_COLLECTION, autocast, fp8_autocast, get_fp8_recipe,  # noqa: F401
                  is_fp8_enabled, update_fp8_metas)
from .sharding import MeshResource  # noqa: F401
from .skipped_updates import fp8_skipped_updates  # noqa: F401
from .dense import dense  # noqa: F401
from .layernorm_mlp import activation, layernorm, layernorm_dense, layernorm_mlp  # noqa: F401
from .primitives.softmax import softmax  # noqa: F401
from .attention import fused_attn  # noqa: F401
