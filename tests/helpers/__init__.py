"""What the tests share: ONNX Runtime runs, exports to bytes, pass harness, toy models and builds.

Tests import helpers from here, never from a ``conftest.py`` or from another test module.
"""
