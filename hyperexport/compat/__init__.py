"""Compatibility layers: other tools' public names and defaults on top of hyperexport.

* :mod:`hyperexport.compat.hyperonnx`: HyperONNX's API (switching is a changed import).

The code is in :mod:`hyperexport.library.compat`; these modules re-export it.
"""
