"""Registration of user-defined fusions: not supported (the fusions are the fixed list in
fused/)."""
from __future__ import annotations

from .op import PREFIX


def _refuse(name: str):
    raise NotImplementedError(f"{PREFIX}.{name}: user-defined fusions are not supported; the "
                              "fuser applies its built-in fusions (Linear+Bias, norm+Linear)")


def register_forward_fusion(op_fusion_func, prepend: bool = False) -> None:
    """Not supported: raises NotImplementedError.

    Parameters
    ----------
    op_fusion_func : callable
        A fusion function.
    prepend : bool, default False
        Where the fusion would go in the list.
    """
    _refuse("register_forward_fusion")


def register_backward_fusion(op_fusion_func, prepend: bool = False) -> None:
    """Not supported: raises NotImplementedError.

    Parameters
    ----------
    op_fusion_func : callable
        A fusion function.
    prepend : bool, default False
        Where the fusion would go in the list.
    """
    _refuse("register_backward_fusion")


def register_forward_backward_fusion(op_fusion_func, prepend: bool = False) -> None:
    """Not supported: raises NotImplementedError.

    Parameters
    ----------
    op_fusion_func : callable
        A fusion function.
    prepend : bool, default False
        Where the fusion would go in the list.
    """
    _refuse("register_forward_backward_fusion")
