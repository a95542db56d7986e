"""Declaring a recipe field once: its type, default, allowed values, check and reading stages.

A recipe field is one attribute of a schema dataclass (``config/schema.py``), declared with
:func:`option`::

    opset: int = option(18, readers=("export", "evaluate", "check"), check=opset_in_range)

The annotation is the type; ``option`` records the default, the allowed values (``choices``), a
one-value ``check`` and the stages that read it (``readers``). Everything else is derived from
that one declaration (:mod:`hyperexport.product.config.validate` validates by walking it; a stage's
``reads`` is :func:`reads_of`; the defaults Hydra composes on are :func:`defaults_of`; the typed
recipe is :func:`from_json`), so there is no second list to keep in step.

Sections (a field whose type is a schema dataclass, e.g. ``check``) carry no readers of their
own: their fields do. A field whose type merely *contains* dataclasses (``inputs: {name:
InputSpec}``, ``custom_ops: [CustomOpSpec]``) is one field, read whole.

The typed recipe a stage receives (:func:`from_json` with ``partial=True``) holds only the fields
the stage reads; reading any other one raises :class:`UnreadFieldError`, so a stage cannot
depend on a field its key does not cover.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

#: The default of a required field (OmegaConf's and Hydra's spelling of "missing").
REQUIRED: Any = "???"

_META = "hyperexport"
_T = typing.TypeVar("_T")


class Invalid(ValueError):
    """Raised by a field's ``check``: ``reason`` names what is wrong; ``at`` a part of the value
    (a key of a mapping), appended to the field's path in the error."""

    def __init__(self, reason: str, at: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.at = at


class UnreadFieldError(AttributeError):
    """A stage read a recipe field it does not declare (the field's ``readers`` lack it)."""


@dataclass(frozen=True)
class FieldSpec:
    """What :func:`option` records about a field besides its type and default.

    Attributes:
        readers: Names of the stages whose result depends on the field (their ``reads``).
        choices: The allowed values, if the field is one of a fixed set.
        check: Raises :class:`Invalid` when a (well-typed) value is not acceptable.
        doc: One line for ``recipes/README.md``-style listings.
    """

    readers: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], None] | None = None
    doc: str = ""


def option(
    default: Any = REQUIRED,
    *,
    readers: tuple[str, ...] = (),
    choices: tuple[Any, ...] | None = None,
    check: Callable[[Any], None] | None = None,
    factory: Callable[[], Any] | None = None,
    doc: str = "",
) -> Any:
    """Declare a recipe field (see the module docstring); ``factory`` for a mutable default."""
    meta = {_META: FieldSpec(readers=tuple(readers), choices=choices, check=check, doc=doc)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type) -> Any:
    """Declare a nested group of fields (a schema dataclass), defaulting to its defaults."""
    return field(default_factory=cls)


def spec_of(f: dataclasses.Field[Any]) -> FieldSpec:
    """The :class:`FieldSpec` of a schema field (an empty one for plain dataclass fields)."""
    spec = f.metadata.get(_META)
    return spec if isinstance(spec, FieldSpec) else FieldSpec()


def is_required(f: dataclasses.Field[Any]) -> bool:
    """Whether the field has no default (the recipe must set it)."""
    return f.default is REQUIRED or (
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a schema dataclass (resolved once per class)."""
    return _hints(cls)


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def section_type(tp: Any) -> type | None:
    """``tp`` if it is a schema dataclass (a section), else None."""
    return tp if isinstance(tp, type) and is_dataclass(tp) else None


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    """``(dotted path, field)`` of every field of ``cls``, sections descended into."""
    types_ = hints(cls)
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        sub = section_type(types_[f.name])
        if sub is not None:
            yield from leaves(sub, f"{path}.")
        else:
            yield path, f


def reads_of(cls: type, stage: str) -> tuple[str, ...]:
    """The dotted fields of schema ``cls`` whose readers include ``stage``, in declaration
    order; a section all of whose fields the stage reads is named whole (``check``)."""
    out: list[str] = []
    types_ = hints(cls)
    for f in fields(cls):
        sub = section_type(types_[f.name])
        if sub is None:
            if stage in spec_of(f).readers:
                out.append(f.name)
            continue
        inner = reads_of(sub, stage)
        if inner and len(inner) == len(list(leaves(sub))) and all("." not in p for p in inner):
            out.append(f.name)
        else:
            out.extend(f"{f.name}.{p}" for p in inner)
    return tuple(out)


def readers_of(cls: type) -> dict[str, tuple[str, ...]]:
    """``{dotted field: its readers}`` of every field of ``cls``."""
    return {path: spec_of(f).readers for path, f in leaves(cls)}


# --------------------------------------------------------------------------------------------
# JSON data <-> typed objects
# --------------------------------------------------------------------------------------------
class _NotRead:
    def __repr__(self) -> str:
        return "<not read>"


NOT_READ: Any = _NotRead()


class Section:
    """Base of the schema dataclasses: an attribute holding :data:`NOT_READ` (a field the stage
    that received this object does not declare) raises :class:`UnreadFieldError`."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if isinstance(value, _NotRead):  # not identity: a copy (pickle) is not read either
            owner = type(self).__name__
            raise UnreadFieldError(
                f"{owner}.{name} is not in this stage's reads: add the stage to the field's "
                "readers in hyperexport/product/config/schema.py"
            )
        return value

    def __repr__(self) -> str:
        items = (f"{f.name}={object.__getattribute__(self, f.name)!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{type(self).__name__}({', '.join(items)})"


def is_read(obj: Any, name: str) -> bool:
    """Whether field ``name`` of the typed section ``obj`` was read (is in the stage's slice)."""
    return not isinstance(object.__getattribute__(obj, name), _NotRead)


def defaults_of(cls: type) -> dict[str, Any]:
    """The defaults of schema ``cls`` as plain data (``???`` for a required field)."""
    out: dict[str, Any] = {}
    types_ = hints(cls)
    for f in fields(cls):
        sub = section_type(types_[f.name])
        if sub is not None:
            out[f.name] = defaults_of(sub)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = to_json(f.default_factory())
        elif f.default is not dataclasses.MISSING:
            out[f.name] = to_json(f.default)
        else:
            out[f.name] = REQUIRED
    return out


def from_json(cls: type[_T], data: Mapping[str, Any], *, partial: bool = False) -> _T:
    """The typed object of schema ``cls`` holding ``data`` (validated JSON-compatible data).

    Args:
        cls: A schema dataclass.
        data: Its fields; an absent field takes its default, or with ``partial`` is not read.
        partial: ``data`` is a stage's recipe slice: absent fields read as
            :class:`UnreadFieldError`, not as their default.
    """
    obj = cls.__new__(cls)
    types_ = hints(cls)
    for f in fields(cls):  # type: ignore[arg-type]
        tp = types_[f.name]
        sub = section_type(tp)
        if f.name in data:
            value = _typed(tp, data[f.name], partial)
        elif partial:
            value = NOT_READ
        elif sub is not None:
            value = from_json(sub, {})
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = f.default
        object.__setattr__(obj, f.name, value)
    return obj


def typed_value(tp: Any, value: Any) -> Any:
    """``value`` (checked data of type ``tp``) typed: sections and specs become objects."""
    return _typed(tp, value, False)


def _typed(tp: Any, value: Any, partial: bool) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        for arg in args:
            if arg is type(None):
                continue
            if _matches(arg, value):
                return _typed(arg, value, partial)
        return value
    sub = section_type(tp)
    if sub is not None:
        return from_json(sub, value, partial=partial)
    if origin is list:
        return [_typed(args[0], v, partial) for v in value]
    if origin is dict:
        return {k: _typed(args[1], v, partial) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _matches(tp: Any, value: Any) -> bool:
    """Whether ``value`` (JSON data) has the shape of ``tp`` (for picking a Union member)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin is list:
        return isinstance(value, list)
    if origin is dict or section_type(tp) is not None:
        return isinstance(value, Mapping)
    return isinstance(tp, type) and isinstance(value, tp)


def to_json(value: Any) -> Any:
    """Plain JSON-compatible data of a typed value (fields not read are left out)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(object.__getattribute__(value, f.name))
            for f in fields(value)
            if not isinstance(object.__getattribute__(value, f.name), _NotRead)
        }
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value
