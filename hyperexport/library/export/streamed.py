"""The export of a streamed model (``weights: stream``, ``docs/streaming.md``): one unit's
weights bound at a time, every weight written from the checkpoint by name.

The TorchScript path exports one unit per step of its generator. While a body unit is exported
its one representative instance is bound (its own parameters: views of the mapped checkpoint);
the parameters outside every hiera instance are bound for the whole export (the root computes
with them); a placeholder's weights stay on the meta device (they are inputs of the root's
graph, never computed with). The dynamo path traces every unit in one program
(``dynamo_path.py``): every unit's representative instance is bound for that program, and every
other hiera instance's weights are zero-stride stand-ins (``torch.export`` refuses meta
parameters beside real inputs; a stand-in is a CPU tensor of the right shape and dtype holding
one element), so the weights resident at once are those of the distinct unit bodies, not the
model's. Each unit's weight initializers are then resolved by name: the
checkpoint's bytes (or a converted copy, one tensor at a time) written once per stored tensor to
``units/weights.data``, in the order and at the offsets the loaded model's export gives them, so
a streamed export writes the same bytes as a loaded one. A weight written unconverted (the
model's dtype is the stored one) is placed at its stored range of the checkpoint's file, for the
weight file's sources (``weights.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence

import onnx_ir as ir
import torch

from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.library.capture.streaming import (
    TORCH_DTYPES,
    StreamedWeights,
    streamed_checkpoint,
)
from hyperexport.library.export.checkpoint_sources import stored_bytes
from hyperexport.library.export.jobs import UnitJob
from hyperexport.library.export.weights import StoredBytes, WeightFile

log = logging.getLogger(__name__)

#: The attribute of the unit wrapper (``units._UnitModule``) holding the exported module: the
#: prefix of every weight name in a unit's graph.
WRAPPER_PREFIX = "inner."


@contextlib.contextmanager
def streamed_export(
    model: torch.nn.Module, record: CaptureRecord, modules: Mapping[str, torch.nn.Module]
) -> Iterator[StreamedWeights | None]:
    """The streamed weights of ``model`` for the export, the outside parameters bound for the
    duration; None (and nothing done) for a loaded model."""
    checkpoint = streamed_checkpoint(model)
    if checkpoint is None:
        yield None
        return
    hiera = tuple({type(modules[call.path]) for call in record.calls})
    weights = StreamedWeights(model, checkpoint, hiera)
    weights.bind_outside()
    try:
        yield weights
    finally:
        weights.release_outside()


def one_unit_bound(
    units: Iterator[tuple[str, ir.Model]], jobs: Sequence[UnitJob], weights: StreamedWeights
) -> Iterator[tuple[str, ir.Model]]:
    """The units of a path that exports one job per step, in job order, each with its module's
    own weights bound while it is exported."""
    for job in jobs:
        with weights.bound_unit(job.module_path):
            name, unit_model = next(units)
        if name != job.name:
            raise RuntimeError(f"the export path yielded unit {name!r} for job {job.name!r}")
        yield name, unit_model


def one_program_bound(
    units: Iterator[tuple[str, ir.Model]], jobs: Sequence[UnitJob], weights: StreamedWeights
) -> Iterator[tuple[str, ir.Model]]:
    """The units of a path that exports every job in one program (the dynamo path), with every
    job's representative instance bound and the other hiera instances' weights stand-ins while
    the program is exported and its units yielded."""
    with weights.bound_with_stand_ins([job.module_path for job in jobs]):
        log.info(
            "streamed export: %d of %d hiera instances bound (the units' representatives), "
            "%.2f GiB of their weights; the others are stand-ins",
            len({job.module_path for job in jobs if job.module_path}),
            len(weights.instances),
            weights.bound_bytes / 2**30,
        )
        yield from units


def externalize_streamed(
    graph: ir.Graph, module_path: str, weights: StreamedWeights, data_file: WeightFile
) -> int:
    """Point ``graph``'s initializers at ``data_file``: weights by their stored name (written
    from the checkpoint once each), everything else as :meth:`WeightFile.externalize` does.
    Returns how many weights were resolved by name."""
    prefix = f"{module_path}." if module_path else ""
    resolved = 0
    for name, value in graph.initializers.items():
        if value.const_value is None:
            continue
        parameter = prefix + name.removeprefix(WRAPPER_PREFIX)
        if not weights.is_parameter(parameter):
            value.const_value = data_file.reference(value.const_value, name)
            continue
        stored = weights.stored_name(parameter)
        dtype = weights.parameter_dtype(parameter)
        value.const_value = data_file.reference_keyed(
            ("stored", stored, dtype),
            functools.partial(weights.tensor, parameter),
            value.const_value,
            name,
            _on_disk(weights, stored, dtype),
        )
        weights.checkpoint.release(stored)
        resolved += 1
    return resolved


def _on_disk(weights: StreamedWeights, stored: str, dtype: torch.dtype) -> StoredBytes | None:
    """Where the stored tensor ``stored`` is on disk, when the model's ``dtype`` is its own
    (its bytes are then written as stored); None when they are converted."""
    tensor = weights.checkpoint.index.tensors[stored]
    if TORCH_DTYPES.get(tensor.dtype) != dtype:
        return None
    return stored_bytes(weights.checkpoint.folder, tensor)
