"""Tensor parallelism across processes: rank launch, the group and the worker loop (tp.py); the
per-forward broadcast's op codes and packing (wire.py)."""
