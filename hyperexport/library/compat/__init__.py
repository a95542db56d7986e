"""Compatibility layers: other tools' public names and defaults on top of hyperexport.

* :mod:`hyperexport.library.compat.hyperonnx`: HyperONNX's API (switching is a changed import).
"""
