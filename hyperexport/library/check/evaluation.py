"""What ONNX Runtime computed on the captured inputs: the record between evaluating and judging.

The check is two steps with different costs. *Evaluating* (``model_evaluator.py``) loads the model,
runs the structural checks and ONNX Runtime (the whole model, then each selected function
alone): seconds to minutes, and the ONNX libraries. *Judging* (``judge.py``) compares what ran
with torch's reference under the recipe's tolerances: numpy only, milliseconds. An
:class:`Evaluation` is what passes from one to the other: this record as JSON
(``evaluation.json``) and the computed arrays as a plain ``.npz`` (``evaluation.npz``, never
pickles; bfloat16 as its ``uint16`` bits, its dtype named in the record). So a build where only
a tolerance changed judges again without running anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.contracts.arrays import load_arrays, save_arrays
from hyperexport.base.contracts.names import EVALUATION_ARRAYS as EVALUATION_ARRAYS
from hyperexport.base.contracts.names import EVALUATION_JSON as EVALUATION_JSON
from hyperexport.base.errors import CheckError
from hyperexport.library.check.results import StructuralResult

#: Suffix of the probe run's output names (the second shape, for dynamic axes).
SECOND_SHAPE = "@second_shape"
#: Bumped whenever the record's layout changes; a record of another version is refused.
FORMAT = 1


@dataclass(frozen=True)
class OutputRun:
    """One computed output and the reference it is compared with.

    Attributes:
        name: Graph output name (with ``@second_shape`` for the probe run), or ``output <i>``
            of a function.
        key: Capture key of the reference array.
        array: Key of the computed array in :attr:`Evaluation.arrays`.
    """

    name: str
    key: str
    array: str


@dataclass(frozen=True)
class FunctionRun:
    """One call site run alone.

    Attributes:
        index: Index of the call site in the manifest's ``calls``.
        call_id: The captured call (``"<path>#<n>"``), to check the record against the manifest.
        outputs: One entry per function output, in order (empty when the run failed).
        error: Why the function could not be run, if so.
        reason: ``scope`` (selected by ``function_scope``) or ``localisation``.
        seconds: Wall time of building the standalone model and running it (in memory only).
    """

    index: int
    call_id: str
    outputs: tuple[OutputRun, ...]
    error: str | None = None
    reason: str = "scope"
    seconds: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Evaluation:
    """Everything evaluating found, before any tolerance is applied.

    Attributes:
        model_path: The evaluated model file, for the report.
        structural: Structural check results (they need no tolerance).
        outputs: The whole model's outputs (at the traced shape, then at the probe shape).
        end_to_end_error: Why the whole model could not be run, if so.
        end_to_end_skipped: Why the whole model was not run (memory), if so.
        functions: The call sites run alone, in the order they ran.
        sessions_built: ONNX Runtime sessions built for the functions.
        timings: ``(phase, seconds)`` pairs (in memory only: not saved).
        arrays: The computed arrays, by the keys the runs name.
    """

    model_path: str
    structural: tuple[StructuralResult, ...]
    outputs: tuple[OutputRun, ...]
    end_to_end_error: str | None
    end_to_end_skipped: str | None
    functions: tuple[FunctionRun, ...]
    sessions_built: int = 0
    timings: tuple[tuple[str, float], ...] = field(default=(), compare=False)
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    def save(self, out_dir: Path) -> None:
        """Write ``evaluation.npz``, then ``evaluation.json`` (last), into ``out_dir``."""
        stored: dict[str, np.ndarray] = {}
        dtypes: dict[str, str] = {}
        for key, array in self.arrays.items():
            if array.dtype.name == "bfloat16":
                stored[key] = array.view(np.uint16)
                dtypes[key] = "bfloat16"
            else:
                stored[key] = array
        save_arrays(out_dir / EVALUATION_ARRAYS, stored)
        record = {
            "format": FORMAT,
            "model_path": self.model_path,
            "structural": [s.to_json() for s in self.structural],
            "outputs": [_output_json(o) for o in self.outputs],
            "end_to_end_error": self.end_to_end_error,
            "end_to_end_skipped": self.end_to_end_skipped,
            "functions": [_function_json(f) for f in self.functions],
            "sessions_built": self.sessions_built,
            # No timings: this file is a cached output that the check stage's key covers, so
            # it must be the same bytes in every fresh cache (timings live in report.json).
            "dtypes": dtypes,
        }
        atomic_write_text(out_dir / EVALUATION_JSON, json.dumps(record, sort_keys=True, indent=1))

    @classmethod
    def load(cls, directory: Path) -> Evaluation:
        """Read an evaluation written by :meth:`save` (data only: nothing it names is run).

        Raises:
            CheckError: When the record is missing, malformed, of another format, or names an
                array the ``.npz`` does not hold.
        """
        path = directory / EVALUATION_JSON
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            arrays = load_arrays(directory / EVALUATION_ARRAYS)
        except (OSError, ValueError) as e:
            raise CheckError(f"cannot read the evaluation in {directory}: {e}") from e
        try:
            if record.get("format") != FORMAT:
                raise CheckError(f"{path} has format {record.get('format')!r}, not {FORMAT}")
            for key, dtype in record["dtypes"].items():
                arrays[key] = _view(arrays[key], dtype)
            evaluation = cls(
                model_path=str(record["model_path"]),
                structural=tuple(
                    StructuralResult(str(s["name"]), bool(s["ok"]), str(s["detail"]))
                    for s in record["structural"]
                ),
                outputs=tuple(_output(o) for o in record["outputs"]),
                end_to_end_error=record["end_to_end_error"],
                end_to_end_skipped=record["end_to_end_skipped"],
                functions=tuple(_function(f) for f in record["functions"]),
                sessions_built=int(record["sessions_built"]),
                arrays=arrays,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckError(f"{path} is not an evaluation record: {e!r}") from e
        missing = [r.array for r in evaluation.runs() if r.array not in arrays]
        if missing:
            raise CheckError(f"{path} names arrays {EVALUATION_ARRAYS} lacks: {missing[:3]}")
        return evaluation

    def runs(self) -> list[OutputRun]:
        """Every computed output, whole model first."""
        return [*self.outputs, *(o for f in self.functions for o in f.outputs)]


def _view(array: np.ndarray, dtype: str) -> np.ndarray:
    if dtype != "bfloat16" or array.dtype != np.uint16:
        raise ValueError(f"cannot read an array stored as {array.dtype} as {dtype}")
    import ml_dtypes

    return array.view(ml_dtypes.bfloat16)


def _output_json(o: OutputRun) -> dict[str, Any]:
    return {"name": o.name, "key": o.key, "array": o.array}


def _output(data: Mapping[str, Any]) -> OutputRun:
    return OutputRun(str(data["name"]), str(data["key"]), str(data["array"]))


def _function_json(f: FunctionRun) -> dict[str, Any]:
    return {
        "index": f.index,
        "call_id": f.call_id,
        "outputs": [_output_json(o) for o in f.outputs],
        "error": f.error,
        "reason": f.reason,
    }


def _function(data: Mapping[str, Any]) -> FunctionRun:
    error = data["error"]
    return FunctionRun(
        index=int(data["index"]),
        call_id=str(data["call_id"]),
        outputs=tuple(_output(o) for o in data["outputs"]),
        error=None if error is None else str(error),
        reason=str(data["reason"]),
    )
