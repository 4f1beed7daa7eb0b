"""The FP8 scales of a checkpointed forward, kept per module for its recompute.

Activation checkpointing runs a module's forward twice: first without saving activations
(recompute phase 1), then again inside the backward (phase 2). Under delayed scaling the
step's scale update can run between the two, so phase 1 records the scales each call used and
phase 2 replays them call by call: the recompute then reproduces the forward bit for bit.

The stash lives on the module (`_fp8_checkpoint_stash`, one list of recorded scales per
checkpointed call, oldest first). NVIDIA TE's FP8GlobalStateManager reaches it through a
module's `fp8_meta` dict (`copy_forward_fp8_meta_tensors_for_recompute` opens a record,
`get_old_fp8_meta_tensors_for_recompute` takes the oldest for the replay), and the modules
call those methods themselves, so code that wraps them sees every stash and restore.
Nothing here depends on the module layer or on the autocast state.
"""
from __future__ import annotations

import weakref
from typing import Optional

# NVIDIA TE's fp8_meta key: set once a checkpointed delayed-scaling forward stashed its scales
RECOMPUTE_POS_KEY = "global_fp8_buffer_pos_fwd_recompute"

# one fp8_meta dict per live module, outside the module (so that pickling or deep-copying a
# module never carries a link back to the original)
_META: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class FP8Meta(dict):
    """A module's ``fp8_meta`` (NVIDIA TE's dict of FP8 metadata), the same object on every read,
    with a weak link to the module whose recompute stash it reaches."""
    __slots__ = ("_owner",)

    def __init__(self, owner):
        super().__init__()
        self._owner = weakref.ref(owner)


def meta_of(module) -> FP8Meta:
    """The module's fp8_meta dict (made on first use, then refreshed by the caller)."""
    meta = _META.get(module)
    if meta is None:
        meta = _META[module] = FP8Meta(module)
    return meta


def owner_of(fp8_meta, who: str):
    """The module whose fp8_meta this is; TypeError for any other dict."""
    owner = fp8_meta._owner() if isinstance(fp8_meta, FP8Meta) else None
    if owner is None:
        raise TypeError(f"transformer_engine.pytorch.{who}: expects the fp8_meta of a "
                        f"transformer_engine.pytorch module (module.fp8_meta); got "
                        f"{type(fp8_meta).__name__}")
    return owner


def open_record(module) -> int:
    """Appends an empty record for this checkpointed call's scales; returns its position."""
    stash = getattr(module, "_fp8_checkpoint_stash", None)
    if stash is None:
        stash = module._fp8_checkpoint_stash = []
    stash.append([])
    return len(stash) - 1


def last_record(module) -> list:
    """The record that open_record appended last (filled by the call that opened it)."""
    return module._fp8_checkpoint_stash[-1]


def start_replay(module) -> None:
    """Moves the oldest record to the module's replay slot (none when nothing was stashed)."""
    stash = getattr(module, "_fp8_checkpoint_stash", None)
    module._fp8_replay = stash.pop(0) if stash else None


def take_replay(module) -> Optional[list]:
    """The record start_replay moved (None if none), emptying the slot."""
    replay = getattr(module, "_fp8_replay", None)
    module._fp8_replay = None
    return replay
