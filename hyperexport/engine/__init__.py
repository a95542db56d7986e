"""The build system: stages, keys, the content-addressed cache, the runner and its report.

Nothing in this package imports torch or onnx at module level: a no-op build (every stage a
cache hit) must stay fast and must not load them.
"""
