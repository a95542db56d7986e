"""Atomic file writes: a temporary file in the same directory, then ``os.replace``.

A reader (or a crashed run) never sees a half-written file. Used by the capture, the export
bundle and the build alike; written once, in the engine (``engine/files.py``), which imports
nothing of hyperexport.
"""

from __future__ import annotations

from hyperexport.engine.files import atomic_write_bytes, atomic_write_text, atomic_write_with

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_with"]
