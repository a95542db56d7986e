"""Models for recipes: transformers checkpoints by path or hub id (``pretrained``) and the
resolution of ``hiera: auto`` / ``inputs: auto`` on the live model (``auto``).

Importing this package does not import torch; :func:`pretrained` imports it when called.
"""

from __future__ import annotations

from hyperexport.library.models.pretrained import pretrained

__all__ = ["pretrained"]
