"""ONNX Runtime sessions for the check: CPU, deterministic, bfloat16 fed and fetched as bits."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from hyperexport.base.errors import CheckError
from hyperexport.base.thread_budget import thread_budget

logger = logging.getLogger(__name__)

_BF16 = "tensor(bfloat16)"
_BF16_ONNX = 16  # TensorProto.BFLOAT16
# Every exception class ONNX Runtime's binding raises, plus RuntimeError for conversion errors.
ORT_ERRORS: tuple[type[Exception], ...] = (
    *(
        obj
        for obj in vars(ort_state).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    ),
    RuntimeError,
)
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"

#: A model whose external data files hold at least this many bytes has its weights read in
#: place (:func:`weights_in_place`), unless it runs ``MatMulNBits``.
IN_PLACE_MIN_BYTES = 1 << 30
#: Session config entries that keep a model's weights in the pages of its data file, which ONNX
#: Runtime maps: without them it copies every weight into its own memory, once by prepacking
#: (MatMul's packed layout) and once by constant folding (a ``Transpose`` of a weight becomes a
#: new tensor). Measured: a session of the 1B-shaped fused fp32 model held 4.9-5.0 GB of
#: anonymous memory with either kept, and its decode in onnxruntime-genai 0.03 against 0.72
#: GB at hidden 1024, the same tokens, no slower (bench/README.md). The outputs differ from a
#: prepacked session's in the last bits (4e-6 at hidden 1024), so small models keep the
#: default and their checks their figures.
IN_PLACE_ENTRIES = {
    "session.disable_prepacking": "1",
    "optimization.disable_specified_optimizers": "ConstantFolding",
}
#: Ops whose CPU kernel needs prepacked weights: ``MatMulNBits`` without them ran 100x slower
#: at hidden 1024 (0.21 against 22 s for one decode) and rounded differently.
_NEEDS_PREPACKING = frozenset({"MatMulNBits"})


def data_files(model_path: Path) -> list[Path]:
    """The files beside the model file at ``model_path`` that can hold its external data
    (``<name>.*``: ``model.onnx.data``), by name."""
    prefix = model_path.name + "."
    return sorted(p for p in model_path.parent.iterdir() if p.name.startswith(prefix))


def weights_in_place(model_path: Path) -> bool:
    """Whether a session of the model file at ``model_path`` should read its weights in place
    (:data:`IN_PLACE_ENTRIES`): its data files (``<name>.*`` beside it) hold at least
    :data:`IN_PLACE_MIN_BYTES` and no node runs an op of :data:`_NEEDS_PREPACKING`. Reads the
    model without its external data."""
    import onnx

    data = sum(p.stat().st_size for p in data_files(model_path) if p.is_file())
    if data < IN_PLACE_MIN_BYTES:
        return False
    proto = onnx.load(str(model_path), load_external_data=False)
    graphs = [proto.graph, *proto.functions]
    if any(node.op_type in _NEEDS_PREPACKING for g in graphs for node in g.node):
        return False
    logger.info(
        "%s: %.1f GiB of weights read in place from the data file (no prepacking, no constant "
        "folding)",
        model_path.name,
        data / (1 << 30),
    )
    return True


def session_options(
    external_data_dir: Path | None = None, *, in_place: bool = False
) -> ort.SessionOptions:
    """Options of every session the library opens: deterministic, quiet, and within the
    process's thread budget (``base/thread_budget.py``) when it was given one; with
    ``in_place``, :data:`IN_PLACE_ENTRIES`."""
    options = ort.SessionOptions()
    options.use_deterministic_compute = True
    options.log_severity_level = 3
    budget = thread_budget()
    if budget is not None:
        options.intra_op_num_threads = budget
        options.inter_op_num_threads = 1
    if external_data_dir is not None:
        options.add_session_config_entry(_EXTERNAL_FOLDER_KEY, str(external_data_dir))
    if in_place:
        for key, value in IN_PLACE_ENTRIES.items():
            options.add_session_config_entry(key, value)
    return options


class OrtRunner:
    """One InferenceSession on the CPU execution provider.

    A model file with large float weights reads them in place (:func:`weights_in_place`).

    Args:
        model: A model file path, or a serialized ModelProto.
        external_data_dir: For a serialized model whose tensors refer to external data: the
            directory their ``location`` is relative to.

    Raises:
        CheckError: When ONNX Runtime refuses the model.
    """

    def __init__(self, model: Path | bytes, *, external_data_dir: Path | None = None) -> None:
        source = str(model) if isinstance(model, Path) else model
        in_place = isinstance(model, Path) and weights_in_place(model)
        options = session_options(external_data_dir, in_place=in_place)
        try:
            self._session = ort.InferenceSession(
                source, options, providers=["CPUExecutionProvider"]
            )
        except ORT_ERRORS as e:
            raise CheckError(f"ONNX Runtime cannot load the model: {e}") from e
        self.input_names = tuple(i.name for i in self._session.get_inputs())
        self.output_names = tuple(o.name for o in self._session.get_outputs())
        self._input_types = {i.name: i.type for i in self._session.get_inputs()}
        self._output_types = {o.name: o.type for o in self._session.get_outputs()}

    def run(
        self, feeds: Mapping[str, np.ndarray], output_shapes: Sequence[tuple[int, ...]]
    ) -> list[np.ndarray]:
        """Run the session and return every output in order.

        Args:
            feeds: Input name to array (bfloat16 as ``ml_dtypes.bfloat16``).
            output_shapes: Expected shape of each output; only used to pre-allocate bfloat16
                outputs, which ONNX Runtime cannot return as numpy arrays.

        Raises:
            CheckError: When the run fails.
        """
        uses_bf16 = _BF16 in self._input_types.values() or _BF16 in self._output_types.values()
        try:
            if not uses_bf16:
                return list(self._session.run(None, dict(feeds)))
            return self._run_bound(feeds, output_shapes)
        except ORT_ERRORS as e:
            raise CheckError(f"ONNX Runtime run failed: {e}") from e

    def _run_bound(
        self, feeds: Mapping[str, np.ndarray], output_shapes: Sequence[tuple[int, ...]]
    ) -> list[np.ndarray]:
        binding = self._session.io_binding()
        for name, array in feeds.items():
            if self._input_types.get(name) == _BF16:
                bits = np.ascontiguousarray(array).view(np.uint16)
                binding.bind_ortvalue_input(
                    name, ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, _BF16_ONNX)
                )
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(array))
        buffers: dict[str, np.ndarray] = {}
        for name, shape in zip(self.output_names, output_shapes, strict=True):
            if self._output_types[name] == _BF16:
                buffers[name] = np.zeros(shape, dtype=np.uint16)
                value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buffers[name], _BF16_ONNX)
                binding.bind_ortvalue_output(name, value)
            else:
                binding.bind_output(name)
        self._session.run_with_iobinding(binding)
        results = binding.get_outputs()
        return [
            buffers[name].view(ml_dtypes.bfloat16) if name in buffers else results[i].numpy()
            for i, name in enumerate(self.output_names)
        ]
