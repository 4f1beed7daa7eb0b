"""TransformerLayer: one encoder or decoder block from MultiheadAttention and te.LayerNormMLP.

Pre-LN (default, GPT/Llama): h = x + drop(attn(LN(x))); [decoder: h = h + drop(xattn(LN(h), enc))];
out = h + drop(mlp(LN(h))).
apply_residual_connection_post_layernorm: the residual of each block is the norm's output instead
of its input. output_layernorm (BERT post-LN, with the previous flag): the attention takes x
un-normalised and a final norm is applied to the block's output:
h = x + drop(attn(x)); out = LN_out(LN(h) + drop(mlp(LN(h)))).
parallel_attention_mlp (Falcon/GPT-J): out = x + drop(attn(LN1(x)) + mlp(LN2(x))).
drop(.) is dropout (hidden_dropout) then drop-path (stochastic depth, per sample, drop_path_rate).
Where drop(.) is the identity (eval, or both rates 0) and the residual is the block input, the
residual adds ride the output GEMMs (attention projection, FC2: their C operand) and FC2's
residual gradient rides the second norm's backward, so the connections cost no add kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .attention.multi_head_attention import MultiheadAttention
from .attention.dot_product_attention import set_context_parallel_group_of
from .module._input_check import call_checked
from .module import LayerNorm, LayerNormMLP, RMSNorm
from .module._nv_options import check_off

_OP = "TransformerLayer"


def _drop_path(x: torch.Tensor, rate: float, training: bool, batch_dim: int) -> torch.Tensor:
    """Stochastic depth: drop the whole branch of a sample with probability `rate`."""
    if rate <= 0.0 or not training:
        return x
    if rate >= 1.0:
        return x * 0.0  # every sample's branch dropped (no rescale: 1 - rate is 0)
    shape = [1] * x.dim()
    shape[batch_dim] = x.shape[batch_dim]
    keep = torch.empty(shape, dtype=x.dtype, device=x.device).bernoulli_(1.0 - rate)
    return x * keep / (1.0 - rate)


class TransformerLayer(torch.nn.Module):
    """NVIDIA TE's TransformerLayer arguments; see the module docstring for the block structures."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5,
                 hidden_dropout: float = 0.1, attention_dropout: float = 0.1,
                 init_method=None, output_layer_init_method=None, layer_number: Optional[int] = None,
                 kv_channels: Optional[int] = None, self_attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, enc_dec_attn_mask_type: str = "no_mask",
                 enc_dec_window_size: Optional[Tuple[int, int]] = None, tp_group=None, tp_size: int = 1,
                 params_dtype: Optional[torch.dtype] = None, get_rng_state_tracker=None,
                 fuse_wgrad_accumulation: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, sequence_parallel: bool = False,
                 apply_residual_connection_post_layernorm: bool = False, output_layernorm: bool = False,
                 parallel_attention_mlp: bool = False, layer_type: str = "encoder",
                 drop_path_rate: float = 0.0, set_parallel_mode: bool = False,
                 fuse_qkv_params: bool = False, rotary_pos_interleaved: bool = False,
                 zero_centered_gamma: bool = False, qkv_weight_interleaved: bool = True,
                 bias: bool = True, activation: str = "gelu", normalization: str = "LayerNorm",
                 device=None, attn_input_format: str = "sbhd", name: Optional[str] = None,
                 softmax_scale: Optional[float] = None, activation_params: Optional[dict] = None,
                 bottom_right_diagonal: Optional[bool] = None,
                 enc_dec_bottom_right_diagonal: Optional[bool] = None,
                 ub_tp_comm_overlap: bool = False, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 qk_norm_type: Optional[str] = None, qk_norm_eps: float = 1e-6,
                 qk_norm_before_rope: bool = False, softmax_type: str = "vanilla"):
        super().__init__()
        check_off(_OP, ub_tp_comm_overlap=ub_tp_comm_overlap, ub_overlap_ag=ub_overlap_ag,
                  ub_overlap_rs=ub_overlap_rs, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                  ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad,
                  bottom_right_diagonal=bottom_right_diagonal,
                  enc_dec_bottom_right_diagonal=enc_dec_bottom_right_diagonal,
                  qk_norm_type=qk_norm_type, softmax_type=softmax_type)
        if layer_type not in ("encoder", "decoder"):
            raise ValueError(f"{_OP}: layer_type is {layer_type!r}; expected 'encoder' or 'decoder'")
        if parallel_attention_mlp and (layer_type == "decoder" or output_layernorm):
            raise ValueError(f"{_OP}: parallel_attention_mlp works with layer_type 'encoder' and "
                             "output_layernorm=False only")
        if normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"{_OP}: normalization is {normalization!r}; expected LayerNorm or RMSNorm")
        if not 0.0 <= hidden_dropout < 1.0:
            raise ValueError(f"{_OP}: hidden_dropout is {hidden_dropout}; expected [0, 1)")
        if not 0.0 <= drop_path_rate <= 1.0:
            raise ValueError(f"{_OP}: drop_path_rate is {drop_path_rate}; expected [0, 1]")
        if attn_input_format not in ("sbhd", "bshd", "thd"):
            raise ValueError(f"{_OP}: attn_input_format is {attn_input_format!r}; expected sbhd, bshd or thd")
        self.layer_type, self.output_layernorm = layer_type, output_layernorm
        self.post_ln_residual = apply_residual_connection_post_layernorm
        self.parallel_attention_mlp = parallel_attention_mlp
        self.hidden_dropout, self.drop_path_rate = hidden_dropout, drop_path_rate
        self.attn_input_format = attn_input_format
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        # post-LN residual needs the norm's output back from the fused norm+GEMM modules
        want_ln_out = apply_residual_connection_post_layernorm and not output_layernorm
        common = dict(layernorm_epsilon=layernorm_epsilon, init_method=init_method,
                      output_layer_init_method=output_layer_init_method, layer_number=layer_number,
                      tp_group=tp_group, tp_size=tp_size, num_gqa_groups=num_gqa_groups,
                      fuse_wgrad_accumulation=fuse_wgrad_accumulation,
                      get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
                      params_dtype=params_dtype, return_layernorm_output=want_ln_out,
                      set_parallel_mode=set_parallel_mode, fuse_qkv_params=fuse_qkv_params,
                      zero_centered_gamma=zero_centered_gamma, qkv_weight_interleaved=qkv_weight_interleaved,
                      bias=bias, normalization=normalization, device=device, qkv_format=attn_input_format,
                      rotary_pos_interleaved=rotary_pos_interleaved, softmax_scale=softmax_scale)
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, kv_channels=kv_channels,
            attention_dropout=attention_dropout, attn_mask_type=self_attn_mask_type,
            window_size=window_size, input_layernorm=not output_layernorm, attention_type="self",
            **common)
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size, num_attention_heads, kv_channels=kv_channels,
                attention_dropout=attention_dropout, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, input_layernorm=True, attention_type="cross", **common)
        self.layernorm_mlp = LayerNormMLP(
            hidden_size, ffn_hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
            get_rng_state_tracker=get_rng_state_tracker, tp_group=tp_group, tp_size=tp_size,
            init_method=init_method, output_layer_init_method=output_layer_init_method, bias=bias,
            activation=activation, normalization=normalization, params_dtype=params_dtype,
            return_layernorm_output=apply_residual_connection_post_layernorm,
            zero_centered_gamma=zero_centered_gamma, set_parallel_mode=set_parallel_mode,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation, device=device,
            activation_params=activation_params)
        if output_layernorm:
            norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = norm_cls(hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
                                      params_dtype=params_dtype, zero_centered_gamma=zero_centered_gamma,
                                      device=device)

    def _drop_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return residual + x
        if self.hidden_dropout > 0.0:
            x = F.dropout(x, self.hidden_dropout, True)
        # packed tokens (thd): per-token depth drop is meaningless
        if self.drop_path_rate > 0.0 and self.attn_input_format != "thd":
            x = _drop_path(x, self.drop_path_rate, True, 1 if self.attn_input_format == "sbhd" else 0)
        return residual + x

    def _residual_in_gemms(self) -> bool:
        """Whether the residual adds can ride the output GEMMs (attention projection, FC2): only
        when nothing acts on a branch between its GEMM and the add (dropout, drop-path) and the
        residual is the block input (pre-norm)."""
        if self.post_ln_residual or self.parallel_attention_mlp:
            return False
        return not self.training or (self.hidden_dropout == 0.0 and (
            self.drop_path_rate == 0.0 or self.attn_input_format == "thd"))

    @staticmethod
    def _split(outputs, want_ln_out: bool):
        if want_ln_out:
            return outputs[0], outputs[-1]
        return outputs, None

    def set_context_parallel_group(self, cp_group, cp_global_ranks=None, cp_stream=None,
                                   cp_comm_type: str = "p2p") -> None:
        """Split the sequence of self-attention over `cp_group` (see DotProductAttention's)."""
        set_context_parallel_group_of(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None,
                self_attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                encoder_output: Optional[torch.Tensor] = None, enc_dec_attn_mask=None,
                enc_dec_attn_mask_type: Optional[str] = None,
                enc_dec_window_size: Optional[Tuple[int, int]] = None,
                is_first_microbatch: Optional[bool] = None, checkpoint_core_attention: bool = False,
                inference_params=None, rotary_pos_emb=None, core_attention_bias_type: str = "no_bias",
                core_attention_bias=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                max_seqlen_q=None, max_seqlen_kv=None, fast_zero_fill: bool = True) -> torch.Tensor:
        kind = hidden_states.device.type
        if torch.is_autocast_enabled(kind):
            # the residual stream in the autocast dtype too, so the block's output is in it
            hidden_states = hidden_states.to(torch.get_autocast_dtype(kind))
        want_ln_out = self.post_ln_residual and not self.output_layernorm
        fused = self._residual_in_gemms()
        attn = self.self_attention(
            hidden_states, attention_mask=attention_mask, attn_mask_type=self_attn_mask_type,
            window_size=window_size, is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention, inference_params=inference_params,
            rotary_pos_emb=rotary_pos_emb, core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, fast_zero_fill=fast_zero_fill,
            _residual=hidden_states if fused else None)
        attn_out, ln_out = self._split(attn, want_ln_out)
        residual = ln_out if want_ln_out else hidden_states
        if self.parallel_attention_mlp:
            mlp_out, mlp_ln = self._split(self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch),
                                          self.post_ln_residual)
            return self._drop_add(attn_out + mlp_out, residual)
        hidden = attn_out if fused else self._drop_add(attn_out, residual)
        if self.layer_type == "decoder":
            cross = self.inter_attention(
                hidden, attention_mask=enc_dec_attn_mask, encoder_output=encoder_output,
                attn_mask_type=enc_dec_attn_mask_type, window_size=enc_dec_window_size,
                is_first_microbatch=is_first_microbatch,
                checkpoint_core_attention=checkpoint_core_attention, fast_zero_fill=fast_zero_fill,
                _residual=hidden if fused else None)
            cross_out, cross_ln = self._split(cross, want_ln_out)
            hidden = cross_out if fused else self._drop_add(cross_out, cross_ln if want_ln_out else hidden)
        if fused and self.layernorm_mlp.residual_in_gemm():
            out = self.layernorm_mlp(hidden, is_first_microbatch=is_first_microbatch, _add_input=True)
            return self.layernorm(out) if self.output_layernorm else out
        mlp = self.layernorm_mlp(hidden, is_first_microbatch=is_first_microbatch)
        mlp_out, mlp_ln = self._split(mlp, self.post_ln_residual)
        out = self._drop_add(mlp_out, mlp_ln if self.post_ln_residual else hidden)
        if self.output_layernorm:
            out = self.layernorm(out)
        return out

    def __call__(self, *args, **kwargs):
        return call_checked(self, "hidden_states", torch.nn.Module.__call__, args, kwargs)
