"""Attention benchmark cases (imported by benchmarks/bench_attention.py; each also runs on its own)."""
