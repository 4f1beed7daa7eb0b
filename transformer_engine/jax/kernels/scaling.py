"""Delayed-scaling update in jnp (functional twin of the native batched kernel)."""
from __future__ import annotations

import jax.numpy as jnp


def delayed_scaling_update(history, scale, fp8_max, algo="max", margin=0.0, skipped=None):
    """Returns (new_history, new_scale, new_scale_inv) for history [L, n] and scale [n]; with
    `skipped` (int32 [n]) also the new skip counts as a fourth value.

    A tensor whose current amax (row 0) is NaN or infinite is skipped, as in the native kernel:
    its history is not rolled (row 0 cleared), its scale stays the last finite one and its skip
    count grows by one."""
    if callable(algo):
        amax = algo(history).astype(jnp.float32)
    elif algo == "most_recent":
        amax = history[0]
    elif algo == "max":
        amax = jnp.max(history, axis=0)  # NaN propagates, as in the kernel
    else:
        raise ValueError(f"delayed_scaling_update: algo is {algo!r}; expected 'max', 'most_recent' or a callable")
    bad = ~jnp.isfinite(history[0])
    rolled = jnp.roll(history, -1, axis=0).at[0].set(0.0)
    new_history = jnp.where(bad, history.at[0].set(0.0), rolled)
    candidate = (jnp.float32(fp8_max) / amax) / jnp.float32(2.0 ** margin)
    ok = ~bad & (amax > 0) & jnp.isfinite(amax) & jnp.isfinite(candidate)
    new_scale = jnp.where(ok, candidate, scale)
    if skipped is None:
        return new_history, new_scale, 1.0 / new_scale
    return new_history, new_scale, 1.0 / new_scale, skipped + bad.astype(skipped.dtype)
