"""The count of FP8 scale updates skipped because an amax was NaN or infinite, per dense-like op
of the Flax modules, and the warning about it (once per op and recipe).

The count lives next to the scales in the FP8_COLLECTION variables (`<op>_skipped_updates`, one
value per tensor: input, kernel, output gradient) and grows inside the jitted step with no host
synchronisation (see transformer_engine.jax.fp8). Nothing in the step can warn without waiting
for the device, so the counter is the signal: `fp8_skipped_updates` reads it, and warns when it
reads concrete values. NVTE_JAX_WARN_SKIPPED_UPDATES=1 adds a host callback to every step that
warns as soon as a module sees a count (a debugging aid: it waits for the device)."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .fp8 import FP8_COLLECTION

SKIPPED_SUFFIX = "_skipped_updates"
_HISTORY_SUFFIX = "_amax_history"
_WARNED = set()  # (op path, recipe name) already warned about in this process


def recipe_of_op(collection: dict, op: str) -> str:
    """The recipe an op's state was made for: delayed scaling keeps an amax history."""
    return "DelayedScaling" if op + _HISTORY_SUFFIX in collection else "Float8CurrentScaling"


def warn_once(path: str, recipe_name: str, count) -> None:
    """Warn (a RuntimeWarning) about `count` skipped updates of the op at `path`, the first time
    a non-zero count is seen for that op and recipe."""
    total = int(np.sum(np.asarray(count)))
    if total <= 0 or (path, recipe_name) in _WARNED:
        return
    _WARNED.add((path, recipe_name))
    warnings.warn(
        f"{path}: {total} FP8 scale update(s) with {recipe_name} were skipped because an amax was "
        f"NaN or infinite (a step with non-finite values); the affected tensors keep the scale of "
        f"their last finite update", RuntimeWarning, stacklevel=3)


def warn_in_step(path: str, recipe_name: str, count) -> None:
    """The debugging warning from inside a traced step (a host callback: waits for the device)."""
    jax.debug.callback(lambda c: warn_once(path, recipe_name, c), count)


def _collections(tree: dict, prefix: tuple):
    """(path, dict) of every nested dict of `tree` holding skip counters."""
    if any(isinstance(k, str) and k.endswith(SKIPPED_SUFFIX) for k in tree):
        yield prefix, tree
    for k, v in tree.items():
        if hasattr(v, "items"):
            yield from _collections(dict(v), prefix + (str(k),))


def fp8_skipped_updates(variables, warn: bool = True) -> dict:
    """How many FP8 scale updates of each dense-like op were skipped because an amax was NaN or
    infinite.

    The Flax modules (``DenseGeneral``, ``LayerNormDenseGeneral``, ``LayerNormMLP`` and the
    layers built of them) count, for each tensor they cast to FP8, the steps whose amax was not
    finite: such an amax never enters the amax history and the tensor keeps its last finite
    scale, under ``DelayedScaling`` and ``Float8CurrentScaling`` alike. The count is a variable
    of the ``FP8_COLLECTION`` collection (``<op>_skipped_updates``), updated inside the step like
    the scales. This is the JAX form of the PyTorch modules' ``fp8_skipped_updates()``.

    Inside ``jax.jit`` the result is traced (nothing waits, nothing is warned about). Outside,
    with ``warn``, the counts are read from the device and a ``RuntimeWarning`` is issued the
    first time an op shows a non-zero count under a recipe (once per op and recipe per process).

    Parameters
    ----------
    variables : dict
        The model's variables (``{"params": ..., FP8_COLLECTION: ...}``), the non-parameter
        variables carried from step to step, or the ``FP8_COLLECTION`` collection itself.
    warn : bool, default True
        Warn about non-zero counts when they can be read (outside ``jax.jit``).

    Returns
    -------
    dict
        ``{op path: int32 array [3]}``: for each op (its module path and name joined by ``/``,
        e.g. ``'layer/mlp/wi'``) the skipped updates of its input, kernel and output gradient.
        Empty when there is no FP8 state (FP8 off, or variables made before the count existed).
    """
    if not hasattr(variables, "items"):
        raise TypeError(f"fp8_skipped_updates: variables must be a dict of Flax variables, got "
                        f"{type(variables).__name__}")
    variables = dict(variables)
    collection = dict(variables[FP8_COLLECTION]) if FP8_COLLECTION in variables else variables
    counts = {}
    for prefix, leaves in _collections(collection, ()):
        for name, value in leaves.items():
            if not (isinstance(name, str) and name.endswith(SKIPPED_SUFFIX)):
                continue
            op = name[:-len(SKIPPED_SUFFIX)]
            path = "/".join(prefix + (op,))
            count = jnp.asarray(value).astype(jnp.int32)
            counts[path] = count
            if warn and not isinstance(value, jax.core.Tracer):
                warn_once(path, recipe_of_op(leaves, op), count)
    return counts
