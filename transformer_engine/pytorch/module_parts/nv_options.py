"""Constructor options of NVIDIA Transformer Engine's modules that this library accepts only at
their "off" value: comm-GEMM overlap through userbuffers, symmetric-memory all-reduce, and the
other features named below are not implemented here, so asking for them is an error naming the
module and the argument rather than a silent no-op."""
from __future__ import annotations

USERBUFFERS_FLAGS = ("ub_overlap_ag", "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_dgrad",
                     "ub_bulk_wgrad", "ub_tp_comm_overlap")

# option -> (its off value, what is not implemented)
_OFF = {
    "symmetric_ar_type": (None, "symmetric-memory all-reduce"),
    "bottom_right_diagonal": (None, "an explicit bottom_right_diagonal (the mask type decides it)"),
    "enc_dec_bottom_right_diagonal": (None, "an explicit enc_dec_bottom_right_diagonal"),
    "return_max_logit": (False, "returning the max attention logit"),
    "qk_norm_type": (None, "query/key normalisation"),
    "softmax_type": ("vanilla", "softmax types other than 'vanilla'"),
    "single_grouped_weight": (False, "one grouped weight parameter for all GEMMs"),
    "single_grouped_bias": (False, "one grouped bias parameter for all GEMMs"),
    "use_grouped_tensor": (None, "the grouped-tensor path (see is_module_grouped_tensor_path_supported)"),
}


def check_off(who: str, **options) -> None:
    """Raises NotImplementedError for any option set to something other than its off value."""
    for name, value in options.items():
        if name in USERBUFFERS_FLAGS:
            if value:
                raise NotImplementedError(f"{who}: {name}=True: comm-GEMM overlap through "
                                          "userbuffers is not implemented")
            continue
        off, what = _OFF[name]
        if value != off:
            raise NotImplementedError(f"{who}: {name}={value!r}: {what} is not implemented; "
                                      f"leave it at {off!r}")
