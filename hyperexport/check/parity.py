"""End-to-end parity: the final model in ONNX Runtime against torch's captured outputs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx_ir as ir

from hyperexport.check.compare import compare_arrays
from hyperexport.check.ort_session import OrtRunner
from hyperexport.check.report import TensorResult
from hyperexport.check.settings import CheckSettings, Tolerance
from hyperexport.check.tensors import CapturedArrays
from hyperexport.check.upcast import (
    floored,
    is_low_precision,
    round_to,
    session_payload,
    upcast_feeds,
)
from hyperexport.contracts.manifest import ExportManifest
from hyperexport.errors import CheckError

logger = logging.getLogger(__name__)


def check_end_to_end(
    model_path: Path,
    manifest: ExportManifest,
    arrays: CapturedArrays,
    settings: CheckSettings,
    *,
    second_shape: bool = False,
    model: ir.Model | None = None,
) -> tuple[TensorResult, ...]:
    """Run the model on the captured inputs and compare every output with its reference.

    With ``second_shape``, the inputs and references are those of the probe run at another
    shape (dynamic axes): the model must hold at a shape it was not traced at. Result names get
    the suffix ``@second_shape``.

    Args:
        model_path: The final model file (ONNX Runtime resolves its external data).
        manifest: Gives the capture keys of the graph inputs and outputs, in graph order.
        arrays: The captured arrays.
        settings: Tolerances, with per-output overrides by output name or capture key.
        model: The same model loaded with onnx_ir. A float16/bfloat16 model runs upcast to
            float32 from it (``upcast.py``); any other runs from ``model_path``, so that ONNX
            Runtime reads the weights from the data file beside it (no second copy).

    Returns:
        One result per graph output.

    Raises:
        CheckError: When the model cannot be loaded or run, or its inputs and outputs do not
            line up with the manifest.
    """
    upcast = model is not None and is_low_precision(model)
    if upcast:
        assert model is not None
        payload, _ = session_payload(model, str(model_path.parent))
        runner = OrtRunner(payload, external_data_dir=model_path.parent)
    else:
        runner = OrtRunner(model_path)
    input_keys = manifest.probe_inputs if second_shape else manifest.graph_inputs
    output_keys = manifest.probe_outputs if second_shape else manifest.graph_outputs
    suffix = "@second_shape" if second_shape else ""
    if len(runner.input_names) != len(input_keys):
        raise CheckError(
            f"the model has {len(runner.input_names)} inputs {list(runner.input_names)}, "
            f"the manifest lists {len(input_keys)}"
        )
    if len(runner.output_names) != len(output_keys):
        raise CheckError(
            f"the model has {len(runner.output_names)} outputs {list(runner.output_names)}, "
            f"the manifest lists {len(output_keys)}"
        )
    feeds = {
        name: arrays.get(key) for name, key in zip(runner.input_names, input_keys, strict=True)
    }
    expected = [arrays.get(key) for key in output_keys]
    if upcast:
        feeds = upcast_feeds(feeds)
    actual = runner.run(feeds, [e.shape for e in expected])
    if upcast:
        actual = [round_to(a, e) for a, e in zip(actual, expected, strict=True)]
    results = tuple(
        compare_arrays(a, e, _tolerance(settings, e, name, key), name=f"{name}{suffix}", key=key)
        for a, e, name, key in zip(actual, expected, runner.output_names, output_keys, strict=True)
    )
    for r in results:
        logger.debug("end-to-end %s", r.describe())
    return results


def _tolerance(settings: CheckSettings, expected: np.ndarray, *names: str) -> Tolerance:
    """The settings' tolerance, raised to the floor of a low-precision output's dtype."""
    tolerance = settings.tolerance_for(*names)
    return Tolerance(*floored(tolerance.atol, tolerance.rtol, expected))
