"""End-to-end parity: the final model in ONNX Runtime against torch's captured outputs."""

from __future__ import annotations

import logging
from pathlib import Path

from hyperexport.check.compare import compare_arrays
from hyperexport.check.ort_session import OrtRunner
from hyperexport.check.report import TensorResult
from hyperexport.check.settings import CheckSettings
from hyperexport.check.tensors import CapturedArrays
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

    Returns:
        One result per graph output.

    Raises:
        CheckError: When the model cannot be loaded or run, or its inputs and outputs do not
            line up with the manifest.
    """
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
    actual = runner.run(feeds, [e.shape for e in expected])
    results = tuple(
        compare_arrays(a, e, settings.tolerance_for(name, key), name=f"{name}{suffix}", key=key)
        for a, e, name, key in zip(actual, expected, runner.output_names, output_keys, strict=True)
    )
    for r in results:
        logger.debug("end-to-end %s", r.describe())
    return results
