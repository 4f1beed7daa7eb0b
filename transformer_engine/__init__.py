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
# implemented here. Megatron-Core 0.19 gates at 2.6 on Linear(save_original_input=...), which
# exists here, and at 2.7 imports transformer_engine.pytorch.router, which does not; the level
# stays 2.5 until every 2.6 gate is known to land on implemented code.
# pyproject.toml reads the distribution's version from this line.
__version__ = "2.5.0+portable"
