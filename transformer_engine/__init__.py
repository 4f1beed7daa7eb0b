"""Transformer Engine: FP8/BF16 Transformer building blocks for NVIDIA and AMD GPUs, with a
plain-framework reference backend everywhere else.

Importing this package imports no framework; use transformer_engine.pytorch or
transformer_engine.jax.
"""
# Version rule (PEP 440): the release part is the NVIDIA Transformer Engine API level this library
# implements, so that clients which gate code paths on the TE version (Megatron-Core's
# is_te_min_version, Lightning's and Accelerate's requirements) take the paths for that level and
# never ones needing a later release; the local label "+portable" marks this implementation.
# The level is raised only when every client gate up to the new level lands on something
# implemented here. It is 2.6: Megatron-Core 0.19's six gates at 2.6 set save_original_input on
# Linear / GroupedLinear after construction (implemented; under DelayedScaling refused, which
# Megatron's own conditions avoid) or pass _num_layers_per_chunk to make_graphed_callables behind
# its TE CUDA-graph helper, which Megatron refuses to start with this library at any level (the
# graph helpers it imports, save_fp8_tensors and others, are absent here). At 2.7 Megatron imports
# transformer_engine.pytorch.router, which does not exist here.
# pyproject.toml reads the distribution's version from this line.
__version__ = "2.6.0+portable"
