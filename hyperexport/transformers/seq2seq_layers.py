"""The name published models record for ``CrossKV``, ``Seq2SeqCacheLayer``, ``Seq2SeqKVStep``:
``transformers.seq2seq_layers``.

The code is in :mod:`hyperexport.library.transformers.seq2seq_layers`; the class says this name (``@set_module``,
:mod:`hyperexport.library.public`). Not deprecated: a published model names the class by this
path for as long as the model exists, so the name must resolve
(``tests/library/test_public_homes.py``).
"""

from __future__ import annotations

from hyperexport.library.transformers.seq2seq_layers import (
    CrossKV,
    Seq2SeqCacheLayer,
    Seq2SeqKVStep,
)

__all__ = ["CrossKV", "Seq2SeqCacheLayer", "Seq2SeqKVStep"]
