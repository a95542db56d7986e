"""Exporting captured units to ONNX: one interface, the TorchScript and dynamo paths."""
