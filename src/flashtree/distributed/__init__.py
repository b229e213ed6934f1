"""Tensor parallelism across processes: rank launch and the per-forward broadcast (tp.py)."""
