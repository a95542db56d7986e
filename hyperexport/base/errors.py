"""Typed errors. Each carries the context a user needs to act: argument, module path, stage, recipe."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from hyperexport.engine.errors import CacheUnavailableError, CorruptInputError, StageFailed

__all__ = ["CacheUnavailableError"]

#: ANSI escape sequences (colours, cursor moves) that torch puts in its errors.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

_MOE_FIX = (
    "hyperexport exports the MoE blocks of Mixtral, Qwen2-MoE and OLMoE with its exportable_moe "
    "patch (hyperexport/library/transformers/moe.py); for another architecture add its router and "
    "experts classes to MOE_FAMILIES there"
)


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (torch colours parts of its export errors)."""
    return _ANSI.sub("", text)


def _known_torch_failure(text: str) -> str | None:
    """One line for a torch export failure hyperexport knows the fix of, or None."""
    if "aten::histc" in text:
        return (
            "the TorchScript exporter has no ONNX symbolic for aten::histc, which "
            f"transformers' MoE experts use to count tokens per expert; {_MOE_FIX}"
        )
    if "grouped_mm_fallback" in text:
        return (
            "the dynamo exporter has no ONNX function for transformers::grouped_mm_fallback, "
            f"transformers' MoE experts' grouped matmul; {_MOE_FIX}"
        )
    return None


def relayed(cause: BaseException, with_type: bool = True) -> str:
    """How an error from torch (or any library) is shown inside one of ours.

    ANSI escape sequences are stripped; a failure with a known fix becomes one line naming the
    op and the fix.

    Args:
        cause: The error relayed.
        with_type: Prefix the error's class name.
    """
    text = strip_ansi(str(cause))
    known = _known_torch_failure(text)
    if known is not None:
        return known
    return f"{type(cause).__name__}: {text}" if with_type else text


def override(key: str, value: object) -> str:
    """A command-line override that pastes as it is, into a shell and through Hydra's parser:
    single-quoted for the shell; a list's strings double-quoted for Hydra, so that ``#``, ``/``,
    ``*`` and ``=`` in them stay text (``'check.accept_vacuous=["a.step#0/out.2"]'``)."""

    def hydra(item: object) -> str:
        if isinstance(item, str):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(item, bool):
            return str(item).lower()
        return str(item)

    if isinstance(value, (list, tuple)):
        text = f"{key}=[{','.join(hydra(v) for v in value)}]"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        text = f"{key}={value}"
    else:
        text = f"{key}={hydra(value)}"
    return "'" + text.replace("'", "'\"'\"'") + "'"


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``options``, or ``""`` when none is close."""
    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {matches[0]!r}?" if matches else ""


class HyperExportError(Exception):
    """Base class of every error hyperexport raises on purpose."""


class InputError(HyperExportError):
    """An example input (or a module input met during capture) cannot cross the ONNX boundary."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"input {where}: {reason}")


class HieraError(HyperExportError):
    """A hiera class is unusable: not a module class, or never called in forward."""


class OpsetError(HyperExportError):
    """The requested opset is outside what the chosen export path supports."""


class ModelForwardError(HyperExportError):
    """The model's forward raised during capture."""

    def __init__(self, module_path: str, cause: BaseException) -> None:
        self.module_path = module_path
        where = f"module {module_path!r}" if module_path else "the model"
        super().__init__(f"forward of {where} raised {relayed(cause)}")


class ModuleExportError(HyperExportError):
    """torch.onnx.export failed for one hierarchy unit (a hiera module call, or the root)."""

    def __init__(self, module_path: str, dynamo: bool, cause: BaseException) -> None:
        self.module_path = module_path
        self.dynamo = dynamo
        where = f"module {module_path!r}" if module_path else "the root model"
        path = "dynamo=True" if dynamo else "dynamo=False"
        super().__init__(f"export of {where} ({path}) failed: {relayed(cause)}")


class RewriteError(HyperExportError):
    """A graph pass could not do its job; names the pass and what it met."""


class CheckError(HyperExportError):
    """The exported model is structurally wrong or numerically diverges from torch."""


class ResourceError(HyperExportError):
    """The export would exceed a hard limit (memory, the 2 GiB protobuf limit).

    Raised before the work starts; the message names the estimate and the option that lowers it.
    """


class VersionsError(HyperExportError):
    """The installed libraries cannot work together on the chosen export path.

    Raised before capture and export start; the message is one line naming both versions and
    the release needed (the known combinations: ``hyperexport/base/versions.py``'s ``REQUIREMENTS``).
    """


class RecipeError(HyperExportError):
    """A recipe is invalid. Names the recipe file and the field."""

    def __init__(self, recipe: str, field: str, reason: str) -> None:
        self.recipe = recipe
        self.field = field
        self.reason = reason
        super().__init__(f"recipe {recipe}: field {field!r}: {reason}")


class RecipeErrors(RecipeError):
    """Several fields of one recipe are invalid: one line each, reported together (so a
    recipe is fixed in one try, not one per field). ``field`` and ``reason`` are the first's."""

    def __init__(self, errors: list[RecipeError]) -> None:
        if not errors:
            raise ValueError("RecipeErrors needs at least one RecipeError")
        self.errors = tuple(errors)
        first = errors[0]
        super().__init__(first.recipe, first.field, first.reason)
        if len(errors) > 1:
            fields = "\n".join(f"  field {e.field!r}: {e.reason}" for e in errors)
            self.args = (f"recipe {first.recipe}: {len(errors)} fields refused:\n{fields}",)


class StageError(HyperExportError):
    """A build stage failed. Names the stage and, where known, the module path."""

    def __init__(self, stage: str, cause: BaseException, module_path: str | None = None) -> None:
        self.stage = stage
        self.module_path = module_path
        at = f" at module {module_path!r}" if module_path else ""
        super().__init__(f"stage {stage!r} failed{at}: {relayed(cause, with_type=False)}")

    @classmethod
    def of(cls, failure: StageFailed) -> StageError:
        """The engine's report of a failed stage, in hyperexport's words: the module path the
        cause names (a :class:`ModuleExportError`'s, anywhere in its chain), and a cause from
        torch relayed as one line (:func:`relayed`)."""
        error = cls(failure.stage, failure.cause, module_path_of(failure.cause))
        error.__cause__ = failure.cause
        return error


def module_path_of(error: BaseException) -> str | None:
    """The first ``module_path`` an error in the chain of ``error`` names, or None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        path = getattr(current, "module_path", None)
        if path:
            return str(path)
        current = current.__cause__ or current.__context__
    return None


class OptionsError(HyperExportError, ValueError):
    """An export option or argument is invalid. Names the option (``field``) and why.

    Also a ValueError, so callers that caught the untyped errors of earlier releases still do.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"option {field!r}: {reason}")


class CorruptRecordError(HyperExportError, CorruptInputError):
    """Data read back from disk (a cached record, a published file) cannot be used as it is.

    It is malformed, or names a type this process has not registered. Data never decides what
    code runs, so the build treats the cache entry that holds it as corrupt (it is the engine's
    :class:`~hyperexport.engine.errors.CorruptInputError`): a WARNING, the entry discarded, and
    the stage that made it rebuilt.
    """


# CacheUnavailableError (exit code 3) is the engine's: the cache cannot serve this build.


class ForeignPathError(CacheUnavailableError):
    """A path under the outputs that hyperexport did not create stands where a publication
    goes (a real directory or file at ``<recipe>/<variant>``). It is never moved, overwritten
    or deleted: the build stops before any stage runs, naming it; exit code 3."""

    def __init__(self, path: object) -> None:
        self.path = path
        super().__init__(
            f"{path} exists and was not created by hyperexport (not a publication link); "
            "it is left untouched: move it away or choose another outputs directory"
        )
