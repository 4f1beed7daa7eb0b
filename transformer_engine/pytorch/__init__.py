"""PyTorch frontend of Transformer Engine."""
import torch  # noqa: F401  (the frontend needs torch; fail here with torch's own message)

from ..common import recipe  # noqa: F401
from . import ops  # noqa: F401
from .native import capability, fp8_dtype  # noqa: F401
from .distributed import CudaRNGStatesTracker  # noqa: F401
