"""One module per kernel family; each exposes CASES (see bench_kernels.py)."""
