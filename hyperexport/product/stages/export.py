"""Stage ``export``: export each hierarchy unit to ONNX (``bundle.json`` + ``units/*.onnx``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperexport.base.contracts.names import (
    BUNDLE_JSON,
    CAPTURE_JSON,
    REFERENCE_DIR,
    ROOT_UNIT,
    SAFETENSORS,
    TENSORS_NPZ,
    UNITS_DIR,
    WEIGHTS_FILE,
)
from hyperexport.base.errors import CorruptRecordError
from hyperexport.engine.sourced import LITERAL_MAX, FileSources, Piece, merged
from hyperexport.engine.stage import StageInputs
from hyperexport.library.tasks.registry import task_named
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.recipe_stage import RecipeStage

if TYPE_CHECKING:
    from hyperexport.library.export.weights import Locator, WeightSources

log = logging.getLogger(__name__)


class ExportStage(RecipeStage):
    """``export_units`` on the live model and the trace's capture.

    What to capture again on a fallback (classes, inputs, dynamic axes) is the trace's frozen
    ``capture_spec.json``: ``auto`` is resolved once, by the trace, never here.

    Besides the bundle, the stage writes the capture its bundle was exported from under
    ``reference/``: the check stage's reference, so that check reads only its declared inputs.
    It is a copy of the trace's capture (the cache stores its bytes once), or, with
    ``fallback: true`` after a failed export retried on the other path (logged at WARNING), the
    capture re-made for that path; ``bundle.json`` records the fallback, and from there the
    model's metadata and the report.

    When every tensor of a graph's ``units/weights.data`` is a copy of a checkpoint tensor (the
    model loaded from ``model.path``'s safetensors in their dtype, or streamed from its
    checkpoint unconverted), the stage declares the file's sources (``engine/sourced.py``): the
    checkpoint's bytes, which the model's fingerprint keys, so the cache records ranges of them
    rather than a second copy.
    """

    name: str = "export"
    version: int = 5
    upstream: tuple[str, ...] = ("trace",)
    #: Derived from the schema: the recipe fields that declare "export" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
    needs_model: bool = True
    libraries: tuple[str, ...] = ("torch", "transformers", "onnx", "onnxscript", "onnx-ir")
    publish: tuple[str, ...] = ()

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """The bundle record, the root unit, the first hiera call's unit (``u000``: validation
        requires a hiera class, and the trace that the build ran one), the weights, and the
        reference capture: once, or per graph folder (the encoder-decoder tasks). The other
        units depend on the model: ``bundle.json`` lists them."""
        files = {
            "bundle": BUNDLE_JSON,
            "root_unit": f"{UNITS_DIR}/{ROOT_UNIT}.onnx",
            "first_unit": f"{UNITS_DIR}/u000.onnx",
            "weights": f"{UNITS_DIR}/{WEIGHTS_FILE}",
            "reference_capture": f"{REFERENCE_DIR}/{CAPTURE_JSON}",
            "reference_tensors": f"{REFERENCE_DIR}/{TENSORS_NPZ}",
        }
        return task_named(recipe.task).per_graph(files)

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.library.tasks.models import model_part
        from hyperexport.product.config.fields import from_json, to_json

        # Each graph as the task scopes it (forward: the model as loaded), from the trace's
        # capture of it, into its own folder when there are several. Loading the model first
        # registers the output types the capture trees name.
        part, params = model_part(recipe.task), to_json(recipe)
        locate = _checkpoint_locator(inputs.model(), recipe, inputs.source)
        copies = _disk_copies(inputs.model(), locate)
        for graph in task_named(recipe.task).folders():
            with part.scope(inputs.model(), params, inputs.source, graph) as scoped:
                (out_dir / graph).mkdir(exist_ok=True)
                typed = from_json(RecipeConfig, scoped[1], partial=True)
                self._run(scoped[0], typed, inputs, out_dir / graph, graph, locate, copies)

    def _run(
        self,
        model: Any,
        recipe: RecipeConfig,
        inputs: StageInputs,
        out_dir: Path,
        graph: str = "",
        locate: Locator | None = None,
        copies: int = 2,
    ) -> None:
        from hyperexport.base.contracts.capture_spec import CaptureSpec
        from hyperexport.engine.files import clone_or_copy
        from hyperexport.library.capture.container import Capture
        from hyperexport.library.capture.tree import check_rebuildable
        from hyperexport.library.export.fallback import CaptureCall, export_with_fallback
        from hyperexport.library.export.path import ExportPath
        from hyperexport.library.export.registry import path_for
        from hyperexport.library.export_budget import check_disk_budget, state_bytes
        from hyperexport.product.from_recipe.export_options import export_options
        from hyperexport.product.from_recipe.model import resolve_classes
        from hyperexport.product.from_recipe.resolved_capture import example_inputs

        # Before the first weight is written: the export's data file (the build's one copy)
        # and its blob in the cache, unless the cache records it by reference (a full disk is
        # the cache's refusal, exit 3).
        check_disk_budget(state_bytes(model), out_dir, copies=copies)
        trace_dir = inputs.dir("trace") / graph if graph else inputs.dir("trace")
        capture = Capture.load(trace_dir)
        check_rebuildable(capture.record)  # a CorruptRecordError makes the runner rebuild trace
        spec = CaptureSpec.load(trace_dir)  # what the trace ran: auto resolved there
        options = export_options(recipe, spec)
        first = capture

        def recapture(path: ExportPath) -> Capture:
            # The other path's capture semantics (see export_with_fallback), from the same spec.
            hiera = tuple(resolve_classes(list(spec.hiera), inputs.source))
            return CaptureCall(model, (), example_inputs(spec), spec, hiera)(path)

        _, used = export_with_fallback(
            model,
            capture,
            path=path_for(spec.dynamo),
            opset=recipe.opset,
            options=options,
            out_dir=out_dir,
            recapture=recapture,
            locate=locate,
            declare_sources=lambda path, sources: _declare(inputs, path, sources),
        )
        reference = out_dir / REFERENCE_DIR
        if used is first:
            reference.mkdir()
            for name in (CAPTURE_JSON, TENSORS_NPZ):
                clone_or_copy(trace_dir / name, reference / name)
        else:
            used.save(reference)


def _checkpoint_locator(model: Any, recipe: RecipeConfig, source: str) -> Locator | None:
    """The locator of ``model``'s weights in the checkpoint it was loaded or streamed from
    (``model.path``'s local folder); None for a model without one (a factory's, a hub id's).
    A checkpoint whose headers cannot be read is a WARNING and None (the weights are copied)."""
    from hyperexport.library.capture.streaming import streamed_checkpoint
    from hyperexport.library.export.checkpoint_sources import CheckpointLocator
    from hyperexport.product.config.task_inference import checkpoint_folder

    streamed = streamed_checkpoint(model)
    folder = streamed.folder if streamed else checkpoint_folder(recipe.model, source)
    if folder is None or not any(folder.glob(f"*{SAFETENSORS}")):
        return None
    try:
        return CheckpointLocator(model, folder, streamed.index if streamed else None)
    except CorruptRecordError as e:
        log.warning("the weights will be stored as a copy: %s", e)
        return None


def _disk_copies(model: Any, locate: Locator | None) -> int:
    """How many copies of the weights the build holds on disk: one (the export's file, which
    becomes the published one) when every weight is the checkpoint's bytes, so that the cache
    records ranges of the checkpoint (loaded in the stored dtype, or streamed unconverted);
    :data:`~hyperexport.library.export_budget.DISK_COPIES` otherwise (a blob as well)."""
    from hyperexport.library.capture.streaming import TORCH_DTYPES, streamed_checkpoint
    from hyperexport.library.export.checkpoint_sources import CheckpointLocator
    from hyperexport.library.export_budget import DISK_COPIES

    streamed = streamed_checkpoint(model)
    if streamed is not None:
        stored = {TORCH_DTYPES.get(t.dtype) for t in streamed.index.tensors.values()}
        by_reference = stored == {p.dtype for p in model.parameters()}
    else:
        by_reference = isinstance(locate, CheckpointLocator) and locate.covers_all
    return 1 if by_reference else DISK_COPIES


def _declare(inputs: StageInputs, path: Path, sources: WeightSources) -> None:
    """Declare the weight file at ``path``, unless the tensors only it holds are more than a
    record may hold (then it is stored as a copy, said at INFO)."""
    found = file_sources(sources, path)
    if found is None:
        log.info(
            "%s: stored as a copy: %d tensors (%d bytes) are in no checkpoint file, more than "
            "the %d bytes a record may hold",
            path.name,
            len(sources.unplaced),
            sources.unplaced_bytes,
            LITERAL_MAX,
        )
        return
    inputs.declare_sources(path, found)


def file_sources(sources: WeightSources, path: Path) -> FileSources | None:
    """The engine's record of the weight file at ``path`` (adjacent copies merged; the bytes
    of the tensors only the file holds read from it, as literal pieces); None when those are
    more than :data:`~hyperexport.engine.sourced.LITERAL_MAX`."""
    if sources.unplaced_bytes > LITERAL_MAX:
        return None
    pieces = [Piece(at, s.nbytes, s.source, s.offset) for at, s in sources.copies]
    with open(path, "rb") as fh:
        for offset, length in sources.unplaced:
            fh.seek(offset)
            pieces.append(Piece.literal(offset, fh.read(length)))
    return FileSources(sources.size, merged(pieces), sources.digest)
