"""Registration of user-defined fusions: not supported (the fusions are the fixed list in
fused/); each function raises NotImplementedError naming itself."""
from __future__ import annotations

from .op import PREFIX


def _refusing(name: str, kind: str):
    def register(op_fusion_func, prepend: bool = False) -> None:
        raise NotImplementedError(f"{PREFIX}.{name}: user-defined fusions are not supported; the "
                                  "fuser applies its built-in fusions (Linear+Bias, "
                                  "Linear+Bias+GELU, norm+Linear)")
    register.__name__ = register.__qualname__ = name
    register.__module__ = __name__
    register.__doc__ = f"""Register a {kind} fusion: not supported, raises NotImplementedError.

    Parameters
    ----------
    op_fusion_func : callable
        A fusion function.
    prepend : bool, default False
        Where the fusion would go in the list.
    """
    return register


register_forward_fusion = _refusing("register_forward_fusion", "forward")
register_backward_fusion = _refusing("register_backward_fusion", "backward")
register_forward_backward_fusion = _refusing("register_forward_backward_fusion",
                                             "forward and backward")
