"""Run a published model in another environment's ONNX Runtime and compare it with the build's
captured reference (``tests/e2e/test_old_runtime.py`` starts it with that environment's Python).

Standalone on purpose: it imports only the standard library, numpy and onnxruntime, since the
old environment has nothing else (no torch, no hyperexport). Arguments: the model, the export's
``reference/tensors.npz``, the model's ``manifest.json``, the check's ``atol`` and ``rtol``; it
prints one JSON line (per output: whether every element is within ``atol + rtol * |reference|``).
"""

from __future__ import annotations

import json
import sys


def main(model: str, tensors: str, manifest_path: str, atol: str, rtol: str) -> None:
    import numpy as np
    import onnxruntime as ort

    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    arrays = np.load(tensors, allow_pickle=False)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feeds = {name: arrays[key] for name, key in zip(names, manifest["graph_inputs"])}
    outputs = session.run(None, feeds)
    compared = []
    for out, key in zip(outputs, manifest["graph_outputs"]):
        expected = arrays[key]
        error = np.abs(out.astype(np.float64) - expected)
        compared.append(
            {
                "key": key,
                "shape_equal": list(out.shape) == list(expected.shape),
                "within": bool(np.all(error <= float(atol) + float(rtol) * np.abs(expected))),
                "max_abs_diff": float(np.max(error)),
                "max_abs_reference": float(np.max(np.abs(expected))),
            }
        )
    print(
        json.dumps(
            {
                "onnxruntime": ort.__version__,
                "numpy": np.__version__,
                "inputs": names,
                "outputs": compared,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:6])
