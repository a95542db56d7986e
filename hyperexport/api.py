"""The library entry points, usable without Hydra.

``export_hyper_onnx`` is signature-compatible with HyperONNX's function of the same name. The
build stages call the finer-grained steps (capture, export units, compose) one by one.
"""
