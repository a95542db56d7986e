"""Captured tensors as plain ``.npz`` arrays: see :mod:`hyperexport.contracts.arrays`."""

from __future__ import annotations

from hyperexport.contracts.arrays import load_arrays, raw_dtype, save_arrays

__all__ = ["load_arrays", "raw_dtype", "save_arrays"]
