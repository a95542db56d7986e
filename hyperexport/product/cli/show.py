"""``python -m hyperexport show model.onnx``: the function tree of any ONNX model.

Given a build folder, it shows each of its ``.onnx`` files in turn (an encoder-decoder build's
``decoder_model.onnx`` and ``encoder_model.onnx``); ``--json`` then maps file name to tree.

Prints which module class became which local function, how often each is called and from where,
node counts, opsets, the library versions the model was built with (hyperexport's models
record them), and the model's and each function's inputs and outputs (with shapes where
the model declares them). Works on any ONNX file, hierarchical or not; the class comes from the
function's ``hyperexport.module_class`` metadata when hyperexport wrote it. Reads the graph only
(external weights are not loaded) and never imports torch.

Exit codes: 0 shown, 2 the path is missing or not an ONNX model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.base import exit_codes
from hyperexport.base.contracts.names import (
    FUSED_OPS,
    META_VERSION_PREFIX,
    QUANTIZED_DOMAIN,
    QUANTIZED_OP_TYPES,
    op_id,
)

log = logging.getLogger(__name__)

#: Function metadata keys hyperexport writes (as ``passes.compose_functions`` defines them; read
#: here without importing the passes, which load torch).
META_MODULE_CLASS = "hyperexport.module_class"
META_MODULE_PATH = "hyperexport.module_path"


@dataclass(frozen=True)
class ValueInfo:
    """One graph or function input/output: name, element type and shape (as text)."""

    name: str
    type: str


@dataclass(frozen=True)
class FunctionInfo:
    """One local function.

    Attributes:
        id: ``domain::name``.
        module_class: The module class it was made from (metadata), or "".
        module_path: The module instance (per-instance functions), or "".
        nodes: Nodes in its body (calls of other functions count as one node each).
        call_sites: How many nodes call it (main graph and function bodies).
        runs: How many times it runs when the model runs once (nested calls multiply).
        callees: Functions its body calls, in first-call order.
        opsets: ``{domain: version}`` it imports.
        inputs: Its inputs. Outputs: its outputs.
        quantized: Quantized op type (``com.microsoft``) -> nodes of that type in its body.
        fused: Fused kernel (``rewrite.fuse``, ``domain::op``) -> nodes of that type in its body.
    """

    id: str
    module_class: str
    module_path: str
    nodes: int
    call_sites: int
    runs: int
    callees: tuple[str, ...]
    opsets: dict[str, int]
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    quantized: dict[str, int] = field(default_factory=dict)
    fused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelInfo:
    """What ``show`` prints: the model's header, its main graph and its functions."""

    path: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    metadata: dict[str, str]
    inputs: tuple[ValueInfo, ...]
    outputs: tuple[ValueInfo, ...]
    main_nodes: int
    roots: tuple[str, ...]
    functions: tuple[FunctionInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _type_text(value: Any) -> str:
    dtype = getattr(getattr(value, "type", None), "dtype", None)
    name = dtype.name.lower() if dtype is not None else "?"
    shape = getattr(value, "shape", None)
    if shape is None:
        return name
    dims = [str(d) if isinstance(d, int) else str(getattr(d, "value", d) or "?") for d in shape]
    return f"{name}[{', '.join(dims)}]"


def _values(values: Sequence[Any]) -> tuple[ValueInfo, ...]:
    return tuple(ValueInfo(v.name or "", _type_text(v)) for v in values)


#: Every op a fusion writes (``contracts.names.FUSED_OPS``), as ``domain::op``.
_FUSED = frozenset(op for ops in FUSED_OPS.values() for op in ops)


def _fused(nodes: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        op = op_id(node.domain, node.op_type)
        if op in _FUSED:
            counts[op] = counts.get(op, 0) + 1
    return dict(sorted(counts.items()))


def _quantized(nodes: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        if node.domain == QUANTIZED_DOMAIN and node.op_type in QUANTIZED_OP_TYPES:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def _calls(nodes: Any, functions: Mapping[tuple[str, str, str], Any]) -> list[str]:
    out = []
    for node in nodes:
        fid = f"{node.domain}::{node.op_type}"
        if (node.domain, node.op_type, node.overload) in functions:
            out.append(fid)
    return out


def describe_model(path: Path) -> ModelInfo:
    """Read ``path`` (graph only) and describe its function tree.

    Raises:
        ValueError: ``path`` is not a readable ONNX model.
    """
    from hyperexport.library.model_file import load_model

    try:
        model = load_model(path)
    except Exception as e:  # protobuf, onnx_ir and OS errors are unrelated types
        raise ValueError(f"{path} is not a readable ONNX model: {e}") from e
    functions = dict(model.functions)
    calls_in = {key: _calls(f, functions) for key, f in functions.items()}
    roots = _calls(model.graph, functions)
    by_id = {f"{k[0]}::{k[1]}": k for k in functions}
    runs: dict[str, int] = dict.fromkeys(by_id, 0)
    sites: dict[str, int] = dict.fromkeys(by_id, 0)

    def visit(fid: str, depth: int) -> None:
        runs[fid] += 1
        if depth > len(by_id):  # a recursive function: ONNX forbids it, do not loop
            return
        for callee in calls_in[by_id[fid]]:
            visit(callee, depth + 1)

    for fid in roots:
        visit(fid, 0)
    for ids in [roots, *calls_in.values()]:
        for fid in ids:
            sites[fid] += 1
    infos = []
    for key, f in functions.items():
        fid = f"{key[0]}::{key[1]}"
        infos.append(
            FunctionInfo(
                id=fid,
                module_class=f.metadata_props.get(META_MODULE_CLASS, ""),
                module_path=f.metadata_props.get(META_MODULE_PATH, ""),
                nodes=len(f),
                call_sites=sites[fid],
                runs=runs[fid],
                callees=tuple(dict.fromkeys(calls_in[key])),
                opsets=dict(f.opset_imports),
                inputs=_values(f.inputs),
                outputs=_values(f.outputs),
                quantized=_quantized(f),
                fused=_fused(f),
            )
        )
    return ModelInfo(
        path=str(path),
        ir_version=int(model.ir_version),
        producer=f"{model.producer_name or ''} {model.producer_version or ''}".strip(),
        opsets=dict(model.opset_imports),
        metadata=dict(model.metadata_props),
        inputs=_values(model.graph.inputs),
        outputs=_values(model.graph.outputs),
        main_nodes=len(model.graph),
        roots=tuple(dict.fromkeys(roots)),
        functions=tuple(infos),
    )


def _short_class(f: FunctionInfo) -> str:
    return f.module_class.rsplit(".", 1)[-1] if f.module_class else "(no class)"


def _io(values: Sequence[ValueInfo]) -> str:
    return ", ".join(f"{v.name}: {v.type}" if v.type != "?" else v.name for v in values) or "-"


def render(info: ModelInfo, *, io: bool = True) -> list[str]:
    """The text ``show`` prints: header, main graph, then the tree of functions."""
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(info.opsets.items()))
    lines = [
        f"{info.path}: ONNX IR {info.ir_version}, opsets {opsets}"
        + (f", producer {info.producer}" if info.producer else ""),
    ]
    built_with = [
        f"{k.removeprefix(META_VERSION_PREFIX)} {v}"
        for k, v in info.metadata.items()
        if k.startswith(META_VERSION_PREFIX)
    ]
    if built_with:
        lines.append(f"  built with: {', '.join(built_with)}")
    lines += [
        f"  {k}: {v}"
        for k, v in sorted(info.metadata.items())
        if not k.startswith(META_VERSION_PREFIX)
    ]
    lines += [
        f"inputs:  {_io(info.inputs)}",
        f"outputs: {_io(info.outputs)}",
        f"main graph: {info.main_nodes} nodes, {len(info.roots)} functions called",
    ]
    if not info.functions:
        lines.append("functions: none (a flat model)")
        return lines
    lines.append("functions (class -> function: calls, nodes, opsets):")
    by_id = {f.id: f for f in info.functions}
    shown: set[str] = set()

    def walk(fid: str, depth: int) -> None:
        f = by_id[fid]
        pad = "  " * depth
        again = " (shown above)" if fid in shown else ""
        fops = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(f.opsets.items()))
        where = f" at {f.module_path}" if f.module_path else ""
        quantized = "".join(f", {op} x{n}" for op, n in f.quantized.items())
        lines.append(
            f"{pad}{_short_class(f)} -> {f.id}{where}: x{f.runs} ({f.call_sites} call sites), "
            f"{f.nodes} nodes{quantized}, {fops}{again}"
        )
        if f.fused and not again:
            fused = ", ".join(f"{op} x{n}" for op, n in f.fused.items())
            lines.append(f"{pad}    fused: {fused}")
        if again:
            return
        shown.add(fid)
        if io:
            lines.append(f"{pad}    in:  {_io(f.inputs)}")
            lines.append(f"{pad}    out: {_io(f.outputs)}")
        for callee in f.callees:
            walk(callee, depth + 1)

    for root in info.roots:
        walk(root, 1)
    for f in info.functions:
        if f.id not in shown and f.runs == 0:
            lines.append(f"  {_short_class(f)} -> {f.id}: never called, {f.nodes} nodes")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The ``show`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="hyperexport show", description="Print the function tree of an ONNX model."
    )
    parser.add_argument(
        "model",
        type=Path,
        help="an .onnx file, or a build folder: each of its .onnx files (encoder_model.onnx and "
        "decoder_model.onnx of an encoder-decoder)",
    )
    parser.add_argument("--json", action="store_true", help="print the tree as JSON")
    parser.add_argument("--no-io", action="store_true", help="leave out function inputs/outputs")
    return parser


def main(argv: Sequence[str]) -> int:
    """``show MODEL [--json] [--no-io]``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:  # argparse exits 2 on bad arguments, 0 on --help
        return exit_codes.OK if e.code == 0 else exit_codes.INVALID
    models = sorted(args.model.glob("*.onnx")) if args.model.is_dir() else [args.model]
    if not models or not all(m.is_file() for m in models):
        what = "no .onnx file in the folder" if args.model.is_dir() else "no such file"
        print(f"hyperexport show: {args.model}: {what}", file=sys.stderr)
        return exit_codes.INVALID
    infos = {}
    for model in models:
        try:
            infos[model.name] = describe_model(model)
        except ValueError as e:
            print(f"hyperexport show: {model}: {str(e).splitlines()[0]}", file=sys.stderr)
            return exit_codes.INVALID
    if args.json:
        data = (
            next(iter(infos.values())).to_json()
            if len(infos) == 1
            else {name: info.to_json() for name, info in infos.items()}
        )
        print(json.dumps(data, indent=1, sort_keys=True))
    else:
        lines: list[str] = []
        for name, info in infos.items():
            if len(infos) > 1:
                lines += [f"== {name}", ""] if not lines else ["", f"== {name}", ""]
            lines += render(info, io=not args.no_io)
        print("\n".join(lines))
    return exit_codes.OK
