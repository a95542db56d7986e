"""Models for recipes, public home: transformers checkpoints by path or hub id
(``hyperexport.models.pretrained``, the ``model._target_`` recipes name). The code is in
:mod:`hyperexport.library.models`.

Importing this package does not import torch; :func:`pretrained` imports it when called.
"""

from __future__ import annotations

from hyperexport.models.pretrained import pretrained

__all__ = ["pretrained"]
