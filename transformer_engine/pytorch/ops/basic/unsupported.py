"""Operations of the API that this library does not implement: constructing one raises
NotImplementedError naming it."""
from __future__ import annotations

from ..op import PREFIX, BasicOperation

_REASONS = {
    "GroupedLinear": "use transformer_engine.pytorch.GroupedLinear (the module) for grouped GEMMs",
    "ScaledSwiGLU": "SwiGLU with per-row scales has no kernel here; use SwiGLU and a multiply",
    "ScaledSReLU": "squared ReLU with per-row scales has no kernel here; use SReLU and a multiply",
    "SiTUGLU": "the SiTU gated unit has no kernel here",
    "ScaledSiTUGLU": "the SiTU gated unit has no kernel here",
    "ScaledClampedQGeGLU": "the scaled clamped QGeGLU has no kernel here",
}


def _unsupported(name: str):
    reason = _REASONS[name]

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{PREFIX}.{name} is not supported: {reason}")

    doc = f"""Not supported: constructing it raises NotImplementedError ({reason}).

    Parameters
    ----------
    *args : tuple
        Ignored.
    **kwargs : dict
        Ignored.
    """
    return type(name, (BasicOperation,), {"__init__": __init__, "__doc__": doc,
                                           "__module__": __name__, "__qualname__": name})


GroupedLinear = _unsupported("GroupedLinear")
ScaledSwiGLU = _unsupported("ScaledSwiGLU")
ScaledSReLU = _unsupported("ScaledSReLU")
SiTUGLU = _unsupported("SiTUGLU")
ScaledSiTUGLU = _unsupported("ScaledSiTUGLU")
ScaledClampedQGeGLU = _unsupported("ScaledClampedQGeGLU")
