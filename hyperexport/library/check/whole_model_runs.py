"""End-to-end runs: the final model in ONNX Runtime on torch's captured inputs."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np
import onnx_ir as ir

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.errors import CheckError
from hyperexport.library.check.evaluation import SECOND_SHAPE, OutputRun
from hyperexport.library.check.kv_buffer import padded, valid_rows
from hyperexport.library.check.ort_session import OrtRunner
from hyperexport.library.check.precision import round_to, upcast_feeds
from hyperexport.library.check.tensors import CapturedArrays
from hyperexport.library.check.upcast import is_low_precision, session_payload

logger = logging.getLogger(__name__)


def run_end_to_end(
    model_path: Path,
    manifest: ExportManifest,
    arrays: CapturedArrays,
    computed: MutableMapping[str, np.ndarray],
    *,
    probe_shape: bool = False,
    model: ir.Model | None = None,
) -> tuple[OutputRun, ...]:
    """Run the model on the captured inputs; each output goes into ``computed``.

    With ``probe_shape`` (and a manifest that has a probe), the model runs again on the inputs
    and references of the probe run at another shape (dynamic axes): it must hold at a shape it
    was not traced at. Those outputs' names get the suffix ``@second_shape``. Both runs share
    one ONNX Runtime session (creating one takes seconds for a large model: 6 s at 1B in fp32).

    Args:
        model_path: The final model file (ONNX Runtime resolves its external data).
        manifest: Gives the capture keys of the graph inputs and outputs, in graph order.
        arrays: The captured arrays.
        computed: Where each computed output is stored, under ``e2e/<output name>``.
        probe_shape: Also run the probe shape's inputs.
        model: The same model loaded with onnx_ir. A float16/bfloat16 model runs upcast to
            float32 from it (``upcast.py``) and its outputs are rounded back to the captured
            dtype; any other runs from ``model_path``, so that ONNX Runtime reads the weights
            from the data file beside it (no second copy).

    Returns:
        One run per graph output (and per probe output), naming its reference and its computed
        array.

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
    runs = _run_shape(runner, upcast, manifest, arrays, computed, second_shape=False)
    if probe_shape and manifest.probe_inputs:
        runs += _run_shape(runner, upcast, manifest, arrays, computed, second_shape=True)
    return runs


def _run_shape(
    runner: OrtRunner,
    upcast: bool,
    manifest: ExportManifest,
    arrays: CapturedArrays,
    computed: MutableMapping[str, np.ndarray],
    *,
    second_shape: bool,
) -> tuple[OutputRun, ...]:
    """One run of ``runner`` on the traced shape's captured inputs, or the probe shape's."""
    input_keys = manifest.probe_inputs if second_shape else manifest.graph_inputs
    output_keys = manifest.probe_outputs if second_shape else manifest.graph_outputs
    suffix = SECOND_SHAPE if second_shape else ""
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
    # Shared KV buffers are fed padded, the presents compared on their valid rows (kv_buffer.py).
    data = padded([arrays.get(key) for key in input_keys], manifest.buffers_of(""))
    feeds = dict(zip(runner.input_names, data, strict=True))
    expected = [arrays.get(key) for key in output_keys]
    if upcast:
        feeds = upcast_feeds(feeds)
    actual = runner.run(feeds, [e.shape for e in expected])
    actual = [valid_rows(a, e) for a, e in zip(actual, expected, strict=True)]
    runs = []
    for a, e, name, key in zip(actual, expected, runner.output_names, output_keys, strict=True):
        label = f"{name}{suffix}"
        computed[f"e2e/{label}"] = round_to(a, e) if upcast else a
        runs.append(OutputRun(name=label, key=key, array=f"e2e/{label}"))
    return tuple(runs)
