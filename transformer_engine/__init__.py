"""Transformer Engine: FP8/BF16 Transformer building blocks for NVIDIA and AMD GPUs, with a
plain-framework reference backend everywhere else.

Importing this package imports no framework; use transformer_engine.pytorch or
transformer_engine.jax.
"""
__version__ = "0.1.0"
