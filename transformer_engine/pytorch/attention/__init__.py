"""Attention: the backend dispatcher, DotProductAttention, MultiheadAttention, RoPE, KV cache."""
from ..kernels.attention import AttentionConfig  # noqa: F401  (what get_attention_backend judges)
from .backend_selection import AttentionBackendReport, get_attention_backend  # noqa: F401
from .dot_product_attention import DotProductAttention  # noqa: F401
from .inference import InferenceParams  # noqa: F401
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb  # noqa: F401
from .multi_head_attention import MultiheadAttention  # noqa: F401
