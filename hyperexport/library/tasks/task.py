"""The ``Task`` protocol: what of a model a recipe's ``task`` exports, and how it is judged.

A task is known to the stages in four parts, each in the module of the stage(s) that call it,
so that a stage's key covers only its own part (``engine/code_closure.py``: a change in a task's
judge reruns the check, never the trace):

* :class:`Task` (this module, :mod:`.registry`; every stage): its name, its graphs and the
  files each stage writes for it. Data and names only: no torch, no ONNX library.
* :class:`TaskModel` (:mod:`.models`; trace and export, torch): the module each graph is
  traced and exported from, with the recipe slice it runs under (explicit inputs, hiera), and,
  in the trace, the reference decode it is judged against.
* :class:`TaskDecode` (:mod:`.decode`; evaluate, ONNX Runtime): the decode of the exported
  graphs, written as data.
* :class:`TaskJudge` (:mod:`.judge`; check, numpy): that decode judged against the reference,
  and the files the decode read besides the models, vouched for.

``forward`` (the default: one graph of ``method``) needs none but the first.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hyperexport.base.contracts.names import MANIFEST_JSON, MODEL_FILE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """A task as every stage sees it: names, graphs, files.

    Attributes:
        name: The recipe's ``task`` value.
        graphs: The graphs exported, in the order they run, each in a folder of that name and
            published as ``<graph>_model.onnx`` (Optimum's names); empty: one graph, at the
            folders' root, published as ``model.onnx``.
        trace_files: ``{artifact: file}`` the trace writes besides the capture (the reference
            decode): every run with this task writes them.
        evaluate_files: ``{artifact: file}`` the evaluate stage writes besides the evaluation
            (the decode of the exported graphs).
        check_files: ``{artifact: file}`` the check writes besides its report (published).
        vouched: Files of the trace that the decode reads beside the models (a runtime's
            config): the check names them by digest, as it names the models.
        published: Files of the trace published beside the model (those the trace writes only
            when the checkpoint has them are not declared in ``trace_files``).
        quantized_files: ``{artifact: file}`` the quantize stage writes besides the quantized
            model when ``quantize.method`` is set: published in place of the trace's file of
            the same name (``genai_config.json`` naming the quantized model).
        quantized_evaluate_files: ``{artifact: file}`` the evaluate stage writes besides
            ``evaluate_files`` when ``quantize.method`` is set (the quantized model's decode).
    """

    name: str
    graphs: tuple[str, ...] = ()
    trace_files: Mapping[str, str] = field(default_factory=dict)
    evaluate_files: Mapping[str, str] = field(default_factory=dict)
    check_files: Mapping[str, str] = field(default_factory=dict)
    vouched: tuple[str, ...] = ()
    published: tuple[str, ...] = ()
    quantized_files: Mapping[str, str] = field(default_factory=dict)
    quantized_evaluate_files: Mapping[str, str] = field(default_factory=dict)

    def folders(self) -> tuple[str, ...]:
        """Each graph's folder, relative to a stage's outputs (``""``: the root)."""
        return self.graphs or ("",)

    def per_graph(self, files: Mapping[str, str]) -> dict[str, str]:
        """``files`` (``{artifact: file}``) as a stage writes them for each graph: at the root
        for one graph, else in each graph's folder, the artifact named after the graph
        (``encoder_capture``: ``encoder/capture.json``)."""
        if not self.graphs:
            return dict(files)
        return {f"{g}_{name}": f"{g}/{rel}" for g in self.graphs for name, rel in files.items()}

    def model_file(self, graph: str) -> str:
        """The published ONNX file of ``graph`` (:func:`model_file`)."""
        return model_file(graph)

    def manifest_file(self, graph: str) -> str:
        """The published manifest of ``graph`` (:func:`manifest_file`)."""
        return manifest_file(graph)


def model_file(graph: str) -> str:
    """The published ONNX file of ``graph``: ``encoder_model.onnx``, or ``model.onnx`` (``""``)."""
    return f"{graph}_{MODEL_FILE}" if graph else MODEL_FILE


def manifest_file(graph: str) -> str:
    """The published manifest of ``graph``: ``encoder_manifest.json``, or ``manifest.json``."""
    return f"{graph}_{MANIFEST_JSON}" if graph else MANIFEST_JSON


#: What a stage runs for one graph: the module and the recipe slice to run it under.
Scoped = tuple[Any, Mapping[str, Any]]


class TaskModel(Protocol):
    """The trace's and the export's part of a task (torch)."""

    def record(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, out_dir: Path
    ) -> None:
        """The trace's first step, on the model as loaded: what the exported graphs will be
        judged against (a reference decode), and the files published beside the model."""
        ...

    def scope(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, graph: str
    ) -> contextlib.AbstractContextManager[Scoped]:
        """``(module, slice)`` of ``graph`` for the duration of the block (layers the task
        swaps are put back on exit)."""
        ...


class TaskDecode(Protocol):
    """The evaluate stage's part of a task (ONNX Runtime, no torch, no tolerance)."""

    def __call__(
        self, trace_dir: Path, rewrite_dir: Path, out_dir: Path, quantize_dir: Path | None
    ) -> None:
        """Decode the trace's reference inputs with the rewrite's graphs; write what came out
        (the task's ``evaluate_files``); with ``quantize_dir`` (``quantize.method`` set), the
        quantized model's decode too (``quantized_evaluate_files``)."""
        ...


@dataclass(frozen=True)
class Vouched:
    """What the check found of the trace files a decode read (``Task.vouched``).

    Attributes:
        report: Entries of ``check.json``.
        lines: Lines of ``check.txt``.
        problems: Why the check fails, one line each (empty: it passed).
    """

    report: Mapping[str, Any]
    lines: tuple[str, ...]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class QuantizedDecodeGates:
    """``check.quantized``'s decode gates (meaning: ``config/schema.py`` ``QuantizedCheckSpec``).

    Attributes:
        min_token_agreement: Least share of steps where the quantized model, fed the float
            decode's tokens, picks the float decode's next token.
        min_decode_cosine: Least cosine of a step's logits with the float model's.
        gate: False: the figures are reported and never fail the check.
    """

    min_token_agreement: float
    min_decode_cosine: float
    gate: bool = True


@dataclass(frozen=True)
class QuantizedDecodeVerdict:
    """The quantized model's decode judged: ``check.json`` entries, ``check.txt`` lines, and
    the error to raise after the reports are written (None: passed, or report-only)."""

    report: Mapping[str, Any]
    lines: tuple[str, ...]
    error: Exception | None


class TaskJudge(Protocol):
    """The check stage's part of a task (numpy, no ONNX library)."""

    def vouch(self, trace_dir: Path, quantize_dir: Path) -> Vouched:
        """The files of ``Task.vouched`` judged on their own (before ``check.json`` is written);
        where the quantize stage wrote one in their place (``Task.quantized_files``), that one."""
        ...

    def judge_quantized(
        self, evaluate_dir: Path, gates: QuantizedDecodeGates
    ) -> QuantizedDecodeVerdict | None:
        """The quantized model's decode against the float model's, under ``gates`` (None: the
        evaluation made no quantized decode)."""
        ...

    def judge(
        self, trace_dir: Path, evaluate_dir: Path, out_dir: Path, min_distinct: int = ...
    ) -> tuple[list[str], Exception | None]:
        """The decode judged against the reference (each sequence holding ``min_distinct``
        distinct ids); its report written (the task's ``check_files``). Returns the lines of ``check.txt`` and the error to raise once the
        check's own report is written (None: passed)."""
        ...


class ForwardModel:
    """``task: forward``: the model as loaded, the recipe slice as it is, nothing recorded.

    An encoder-decoder (a transformers config with ``is_encoder_decoder``) runs its forward
    without a cache (``use_cache=False``, restored afterwards): its decoder would otherwise build
    an ``EncoderDecoderCache``, which no ONNX graph can output, and the trace failed on every
    T5, BART or Whisper. The forward's outputs are the same without it; a model to decode with
    is what ``task: text2text-generation`` (or ``auto``) exports, as the INFO line says.
    """

    def record(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, out_dir: Path
    ) -> None:
        return None

    @contextlib.contextmanager
    def scope(
        self, model: Any, params: Mapping[str, Any], recipe_file: str, graph: str
    ) -> Iterator[Scoped]:
        if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            yield model, params
            return
        # Each stack has its own copy of the config (T5's decoder reads its own use_cache).
        configs = {id(c): c for c in _configs(model) if getattr(c, "use_cache", False)}
        if configs:
            log.info(
                "task: forward of encoder-decoder %s: its forward exported without a cache "
                "(use_cache=False); to decode with it, set task: text2text-generation "
                "(speech: automatic-speech-recognition) or task: auto",
                type(model).__name__,
            )
        for config in configs.values():
            config.use_cache = False
        try:
            yield model, params
        finally:
            for config in configs.values():
                config.use_cache = True


def _configs(model: Any) -> Iterator[Any]:
    """The transformers configs of ``model`` and its submodules."""
    modules = model.modules() if hasattr(model, "modules") else [model]
    for module in modules:
        config = getattr(module, "config", None)
        if config is not None:
            yield config
