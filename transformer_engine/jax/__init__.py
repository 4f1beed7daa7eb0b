"""JAX frontend of Transformer Engine. The ops here are the jnp references (the CPU backend and
the oracle); native XLA FFI custom calls build on the same C API."""
import jax  # noqa: F401

from ..common import recipe  # noqa: F401
from . import ops  # noqa: F401
