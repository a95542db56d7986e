"""The recipe reference (``docs/recipe-reference.md``), generated from the schema's declarations.

One source: every row is a field of a schema dataclass (``config/schema.py``) as :func:`option`
declared it: its annotation, default, allowed values (``choices``), the stages that read it
(``readers``) and its one line of meaning (``doc``); each section's text is its class docstring.
``tests/product/config/test_reference.py`` fails when the committed file is stale::

    python -m hyperexport.product.config.reference      # rewrites docs/recipe-reference.md
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_text
from hyperexport.product.config.fields import REQUIRED, hints, section_type, spec_of, to_json
from hyperexport.product.config.schema import RecipeConfig

#: The generated file, from the repository root.
REFERENCE = Path("docs") / "recipe-reference.md"

_HEADER = """\
# Recipe reference

<!-- Generated from hyperexport/product/config/schema.py by
     `python -m hyperexport.product.config.reference`: do not edit by hand
     (tests/product/config/test_reference.py fails when this file is stale). -->

Every recipe field as the schema declares it: its type, its default (*required*: the recipe
must set it), the values it allows, the stages that read it (a stage's cache key covers exactly
the fields it reads, so changing a field reruns those stages and what follows them) and what it
means. Override a field on the command line by its dotted path (`opset=17`,
`check.atol=1e-3`). Examples, `auto` and the checks behind the fields:
[recipes/README.md](../recipes/README.md).
"""


def render_reference() -> str:
    """The reference's Markdown text."""
    parts = [_HEADER]
    for title, cls in _sections(RecipeConfig, "", "Top level"):
        parts.append(_section(title, cls))
    return "\n".join(parts)


def _sections(cls: type, prefix: str, title: str) -> Iterator[tuple[str, type]]:
    """``(title, schema class)`` of ``cls`` and every schema class under it, depth first:
    sections (``check.quantized``) and specs held in a mapping or list (``inputs.<name>``)."""
    yield title, cls
    types_ = hints(cls)
    for f in fields(cls):
        tp = types_[f.name]
        sub = section_type(tp)
        if sub is not None:
            yield from _sections(sub, f"{prefix}{f.name}.", f"`{prefix}{f.name}`")
            continue
        for held, path in _held(tp, f"{prefix}{f.name}"):
            yield from _sections(held, f"{path}.", f"`{path}`")


def _held(tp: Any, path: str) -> Iterator[tuple[type, str]]:
    """Schema classes inside a field's type, with the path of one of them
    (``dict[str, InputSpec]``: ``inputs.<name>``; ``list[CustomOpSpec]``: ``custom_ops[i]``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is dict and section_type(args[1]) is not None:
        yield args[1], f"{path}.<name>"
    elif origin is list and section_type(args[0]) is not None:
        yield args[0], f"{path}[i]"
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _held(arg, path)


def _section(title: str, cls: type) -> str:
    doc = inspect.getdoc(cls) if cls.__doc__ else ""
    rows = [
        "| field | type | default | values | read by | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    types_ = hints(cls)
    for f in fields(cls):
        if section_type(types_[f.name]) is not None:
            continue  # a section: its own table
        spec = spec_of(f)
        cells = [
            f"`{f.name}`",
            _code(str(f.type)),
            _default(f),
            ", ".join(f"`{c}`" for c in spec.choices) if spec.choices is not None else "",
            ", ".join(spec.readers) or "none",
            spec.doc,
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    body = [f"## {title}", ""]
    if doc:
        body += [_markdown(doc), ""]
    body += rows
    return "\n".join(body) + "\n"


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default_factory is not dataclasses.MISSING:
        value = to_json(f.default_factory())
    elif f.default is dataclasses.MISSING or f.default is REQUIRED:
        return "*required*"
    else:
        value = to_json(f.default)
    return _code(json.dumps(value))


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    """A table cell: ``|`` escaped (inside code spans too, as GitHub's tables need)."""
    return text.replace("|", "\\|")


def _markdown(docstring: str) -> str:
    """A docstring as Markdown: reStructuredText's double backticks as code spans."""
    return re.sub(r"``(.+?)``", r"`\1`", docstring)


def write_reference(root: Path) -> Path:
    """Write the reference under ``root`` (atomically); returns its path."""
    path = root / REFERENCE
    atomic_write_text(path, render_reference())
    return path


if __name__ == "__main__":
    print(write_reference(Path(__file__).resolve().parents[3]), file=sys.stderr)
