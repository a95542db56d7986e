"""``report.html`` beside ``report.json``: one self-contained page a person can open after a build.

It shows what was built and with what (date, opset, export path, overrides, the published
model's size: the quantized one's when one was published; library versions), every published
model file with its size, the model's inputs and outputs with shapes and dtypes, the function
tree (built in the browser from the report's data, with a text copy for readers without
scripts), what ``hiera: auto`` / ``inputs: auto`` chose and why, stage timings and the reason
each stage ran, the check per output and per function, the quantized check and the decode check
(``report_checks_html.py``), the fused and quantized op counts, and a picture of the hierarchy:
Graphviz SVG where ``dot`` is installed (without it, the function tree is the hierarchy and is
shown once). Everything is escaped; nothing is fetched from the network.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.contracts.names import AUTO_FILE, MANIFEST_JSON, MODEL_FILE, NO_FUSION
from hyperexport.engine.spans import describe
from hyperexport.product.builds.html_parts import escape as _e
from hyperexport.product.builds.html_parts import num_cell as _num
from hyperexport.product.builds.html_parts import status as _status
from hyperexport.product.builds.html_parts import table as _table
from hyperexport.product.builds.layout import BUILDS
from hyperexport.product.builds.report_checks_html import (
    decode_section,
    models_section,
    ops_section,
    quantized_section,
)
from hyperexport.product.builds.summary import (
    model_label,
    published_models,
    render_tree,
    size_text,
)

log = logging.getLogger(__name__)

REPORT_HTML = "report.html"


_DOT_TIMEOUT = 30.0

_PICTURE_END = "</div><!-- /hierarchy-svg -->"

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0; } td, th { padding: .2em .7em;
  border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
.ok { color: #176f2c; font-weight: 600; } .bad { color: #b00020; font-weight: 600; }
.num { font-variant-numeric: tabular-nums; text-align: right; }
#function-tree ul { list-style: none; padding-left: 1.4em; border-left: 1px dotted #aaa; }
#function-tree > ul { border-left: none; padding-left: 0; }
.fn-class { font-weight: 600; } .fn-id { font-family: monospace; color: #555; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; }
.picture svg { max-width: 100%; height: auto; }
"""

_SCRIPT = """
(function () {
  const data = JSON.parse(document.getElementById("hx-data").textContent);
  const byParent = new Map();
  for (const f of data.functions) {
    const key = f.parent || "";
    if (!byParent.has(key)) byParent.set(key, []);
    byParent.get(key).push(f);
  }
  function list(parent, seen) {
    const ul = document.createElement("ul");
    for (const f of byParent.get(parent) || []) {
      const li = document.createElement("li");
      li.className = "fn";
      li.dataset.function = f.function;
      const cls = document.createElement("span");
      cls.className = "fn-class";
      cls.textContent = (f["class"] || "?").split(".").pop();
      const id = document.createElement("span");
      id.className = "fn-id";
      id.textContent = " \\u2192 " + f.function + " \\u00d7" + f.calls;
      li.append(cls, id);
      if (!seen.has(f.function)) {
        seen.add(f.function);
        const sub = list(f.function, seen);
        if (sub.children.length) li.append(sub);
      }
      ul.append(li);
    }
    return ul;
  }
  const root = document.getElementById("function-tree");
  root.replaceChildren(list("", new Set()));
  root.dataset.rendered = String(data.functions.length);
})();
"""


def write_report_html(out_dir: Path, report: Mapping[str, Any]) -> Path:
    """Write ``out_dir/report.html`` for ``report`` (the content of report.json), atomically.

    The picture is reused from the previous page when the hierarchy is the same (a no-op
    rebuild does not run Graphviz again), or, for a new publication under ``.builds/``, from
    another publication of the recipe with the same hierarchy (a variant that differs only in
    ``check.*`` does not run it either).
    """
    auto = _read_json(out_dir / AUTO_FILE)
    manifest = _read_json(out_dir / MANIFEST_JSON)
    path = out_dir / REPORT_HTML
    digest = hashlib.sha256(hierarchy_dot(report).encode("utf-8")).hexdigest()
    siblings = (
        sorted(out_dir.parent.glob(f"*/{REPORT_HTML}")) if out_dir.parent.name == BUILDS else []
    )
    picture = next(
        (svg for page in [path, *siblings] if (svg := _previous_picture(page, digest)) is not None),
        None,
    )
    if picture is None:
        picture = hierarchy_svg(report)
    page = render_report_html(
        report,
        auto=auto,
        picture=picture,
        picture_key=digest,
        manifest=manifest,
        built=_built(out_dir),
    )
    atomic_write_text(path, page)
    return path


def _built(out_dir: Path) -> str:
    """When the model in ``out_dir`` was published (its file's time, UTC), or ""."""
    try:
        when = (out_dir / MODEL_FILE).stat().st_mtime
    except OSError:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _previous_picture(path: Path, digest: str) -> str | None:
    """The SVG of the page at ``path`` if it was drawn from the same DOT (same digest)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    start = text.find(f'<div class="picture" id="hierarchy-svg" data-dot="{digest}">')
    end = text.find(_PICTURE_END, start)
    if start < 0 or end < 0:
        return None
    return text[text.index(">", start) + 1 : end]


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        log.warning("report.html: %s is unreadable (%s); leaving it out", path, e)
        return None
    return data if isinstance(data, dict) else None


def model_io(capture: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The model's inputs and outputs with shapes and dtypes, from the trace's ``capture.json``.

    Names are the argument names (``input_ids``) and output fields (``last_hidden_state``);
    shapes are those traced (dynamic axes are listed with the inputs of ``auto``).
    """
    tensors = {
        t[0]: (list(t[1]), str(t[2]))
        for t in capture.get("tensors") or []
        if isinstance(t, list) and len(t) == 3
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for side in ("inputs", "outputs"):
        rows = []
        for name, key in _tensor_leaves(capture.get(side), ""):
            shape, dtype = tensors.get(key, (None, None))
            rows.append({"name": name or key, "shape": shape, "dtype": dtype})
        out[side] = rows
    return out


def _tensor_leaves(node: Any, path: str) -> list[tuple[str, str]]:
    """``(name, tensor key)`` of every tensor in a captured structure (``["tensor", key]``,
    ``["dict", [[name, node], ...]]``, ``["object", class, [[field, node], ...]]``,
    ``["tuple"|"list", [node, ...]]``)."""
    if not isinstance(node, list) or not node:
        return []
    kind = node[0]
    if kind == "tensor" and len(node) == 2 and isinstance(node[1], str):
        return [(path, node[1])]
    found: list[tuple[str, str]] = []
    if kind in ("dict", "object") and isinstance(node[-1], list):
        for pair in node[-1]:
            if isinstance(pair, list) and len(pair) == 2:
                found += _tensor_leaves(pair[1], f"{path}.{pair[0]}" if path else str(pair[0]))
    elif kind in ("tuple", "list") and len(node) == 2 and isinstance(node[1], list):
        for i, child in enumerate(node[1]):
            found += _tensor_leaves(child, f"{path}[{i}]" if path else f"output_{i}")
    return found


def hierarchy_dot(report: Mapping[str, Any]) -> str:
    """The function hierarchy as Graphviz DOT: the main graph, each function, caller -> callee."""
    lines = [
        "digraph hierarchy {",
        '  rankdir=LR; node [shape=box, style="rounded,filled", fillcolor="#eef3fb", '
        'fontname="Helvetica", fontsize=11];',
        '  main [label="main graph", fillcolor="#dde6f5"];',
    ]
    ids: dict[str, str] = {}
    for i, f in enumerate(report.get("functions") or []):
        ids[f["function"]] = f"f{i}"
        short = str(f.get("class") or "?").rsplit(".", 1)[-1]
        label = f"{short}\\n{f['function'].split('::')[-1]}\\nx{f.get('calls', 0)}"
        lines.append(f'  f{i} [label="{_dot_escape(label)}"];')
    for f in report.get("functions") or []:
        parent = ids.get(f.get("parent") or "", "main")
        lines.append(f"  {parent} -> {ids[f['function']]};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_escape(text: str) -> str:
    return text.replace('"', '\\"')


def hierarchy_svg(report: Mapping[str, Any]) -> str | None:
    """The hierarchy rendered by Graphviz (``dot -Tsvg``), or None where ``dot`` is absent."""
    dot = shutil.which("dot")
    if dot is None or not report.get("functions"):
        return None
    try:
        done = subprocess.run(
            [dot, "-Tsvg"],
            input=hierarchy_dot(report),
            capture_output=True,
            text=True,
            timeout=_DOT_TIMEOUT,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("report.html: Graphviz failed (%s); the hierarchy is shown as text", e)
        return None
    svg = done.stdout
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else None


def _stages(report: Mapping[str, Any]) -> str:
    rows = [
        f"<tr><td>{_e(s['name'])}</td><td>{_e(s['status'])}</td>"
        f"<td>{_e(s.get('reason') or '')}</td>{_num(s.get('seconds'))}"
        f"<td>{_e(describe(s.get('spans') or {}))}</td></tr>"
        for s in report.get("stages") or []
    ]
    return _table(["stage", "status", "why it ran", "seconds", "of which"], rows)


def _check(report: Mapping[str, Any]) -> str:
    check = report.get("check")
    if not check:
        return "<p>no check ran</p>"
    outputs = [
        f"<tr><td>{_e(o['name'])}</td>{_num(o.get('max_abs'))}{_num(o.get('max_rel'))}"
        f"{_num(o.get('atol'))}{_num(o.get('rtol'))}<td>{_status(o.get('ok'))}"
        f"{' ' + _e(o['error']) if o.get('error') else ''}</td></tr>"
        for o in (check.get("end_to_end") or {}).get("outputs", [])
    ]
    functions = [
        f"<tr><td>{_e(f['function'])}</td><td>{_e(f.get('module_path') or '')}</td>"
        f"{_num(f.get('max_abs'))}<td>{_status(f.get('ok'))}"
        f"{' ' + _e(f['error']) if f.get('error') else ''}</td></tr>"
        for f in check.get("functions") or []
    ]
    structural = [
        f"<tr><td>{_e(s['name'])}</td><td>{_e(s.get('detail') or '')}</td>"
        f"<td>{_status(s.get('ok'))}</td></tr>"
        for s in check.get("structural") or []
    ]
    return (
        f"<p>verdict: {_status(check.get('ok'))}</p>"
        "<h3>per output (ONNX Runtime against torch)</h3>"
        + _table(["output", "max abs", "max rel", "atol", "rtol", ""], outputs)
        + "<h3>per function (each run alone on its captured inputs)</h3>"
        + _table(["function", "module", "max abs", ""], functions)
        + "<h3>structure</h3>"
        + _table(["check", "detail", ""], structural)
    )


def _overview(report: Mapping[str, Any], manifest: Mapping[str, Any] | None, built: str) -> str:
    """What was built and with what: date, opset, path, overrides, size, versions."""
    recipe = (report.get("recipe") or {}).get("config") or {}
    models = {m["artifact"]: m for m in published_models(report)}
    # the model a user deploys: the quantized one when the build published one
    shown = models.get("quantized_model") or models.get("model")
    size = (
        f"{size_text(shown['size'])} ({model_label(shown['artifact'], report)}, {shown['file']})"
        if shown
        else "-"
    )
    opset = (manifest or {}).get("opset", recipe.get("opset"))
    fusion = (manifest or {}).get("fusion") or "none"
    kv_shared = bool((manifest or {}).get("kv_buffers"))
    path = (report.get("export_path") or {}).get("dynamo")
    overrides = report.get("overrides") or []
    env = report.get("environment") or {}
    versions = ", ".join(
        f"{name} {version}" for name, version in sorted((env.get("packages") or {}).items())
    )
    rows = [
        ("built", built or "-"),
        ("opset", f"{opset}"),
        ("export path", "-" if path is None else ("dynamo" if path else "torchscript")),
        *([("fusion", fusion)] if fusion != NO_FUSION else []),
        # passes/share_kv_buffer.py: the pasts are onnxruntime-genai's shared buffers.
        *([("KV cache", "shared buffers (past_present_share_buffer)")] if kv_shared else []),
        ("functions", (manifest or {}).get("function_mode") or recipe.get("functions") or "-"),
        ("overrides", " ".join(overrides) if overrides else "none (the recipe as written)"),
        ("model size", size),
        ("python", env.get("python") or "-"),
        ("versions", versions or "-"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    return f'<h2>build</h2><table id="overview">{body}</table>'


def _io(report: Mapping[str, Any]) -> str:
    io = report.get("io") or {}
    parts = []
    for side in ("inputs", "outputs"):
        rows = [
            f"<tr><td>{_e(t.get('name'))}</td><td>{_e(t.get('shape'))}</td>"
            f"<td>{_e(t.get('dtype'))}</td></tr>"
            for t in io.get(side) or []
        ]
        parts.append(f"<h3>{side}</h3>" + _table(["name", "shape (traced)", "dtype"], rows))
    return '<h2 id="io">inputs and outputs</h2>' + "".join(parts)


def _auto(auto: Mapping[str, Any] | None) -> str:
    if not auto:
        return ""
    inputs = auto.get("inputs") or {}
    rows = [
        f"<tr><td>{_e(name)}</td><td>{_e(spec.get('dtype'))}{_e(spec.get('shape'))}</td>"
        f"<td>{_e(', '.join(f'{a}: {d}' for a, d in (spec.get('dynamic') or {}).items()))}</td></tr>"
        for name, spec in inputs.items()
    ]
    return (
        "<h2>auto</h2>"
        f"<p>hiera: {_e(', '.join(auto.get('hiera') or []) or 'given by the recipe')}<br>"
        f"why: {_e(auto.get('hiera_reason') or '')}</p>"
        f"<p>inputs: {_e(auto.get('inputs_reason') or '')}</p>"
        + (_table(["input", "traced as", "dynamic"], rows) if rows else "")
    )


def render_report_html(
    report: Mapping[str, Any],
    *,
    auto: Mapping[str, Any] | None = None,
    picture: str | None = None,
    picture_key: str = "",
    manifest: Mapping[str, Any] | None = None,
    built: str = "",
) -> str:
    """The page for ``report`` (report.json's content).

    Args:
        report: The content of report.json.
        auto: The content of auto.json, if the recipe used ``auto``.
        picture: The hierarchy as an inline SVG, or None for the text tree.
        picture_key: Digest of the DOT the picture was drawn from (to reuse it next time).
        manifest: The content of manifest.json (opset, export path, function mode).
        built: When the model was published (UTC).
    """
    recipe = report.get("recipe") or {}
    functions = list(report.get("functions") or [])
    tree_text = "\n".join(render_tree(functions)) or "(no functions)"
    data = json.dumps({"functions": functions}, sort_keys=True).replace("</", "<\\/")
    model = ", ".join(
        f"{m['path']} ({model_label(m['artifact'], report)})" for m in published_models(report)
    )
    error = report.get("error")
    drawing = (
        f'<div class="picture" id="hierarchy-svg" data-dot="{_e(picture_key)}">{picture}'
        + _PICTURE_END
        if picture
        # the function tree above is the hierarchy: shown once, not printed again here
        else '<p id="hierarchy-text">Graphviz is not installed: the hierarchy is the function '
        "tree above.</p>"
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>hyperexport: {_e(recipe.get('name'))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{_e(recipe.get('name'))}: {_status(report.get('status') == 'ok')}</h1>",
        f"<p>recipe file: {_e(recipe.get('file'))}<br>model: {_e(model or '-')}</p>",
        f'<p class="bad">error: {_e(error)}</p>' if error else "",
        _overview(report, manifest, built),
        models_section(report),
        _io(report),
        "<h2>function tree (class → function &times; calls)</h2>",
        '<div id="function-tree" data-rendered="0">'
        f"<noscript><pre>{_e(tree_text)}</pre></noscript></div>",
        "<h2>hierarchy</h2>",
        drawing,
        _auto(auto),
        "<h2>stages</h2>",
        _stages(report),
        "<h2>check</h2>",
        _check(report),
        quantized_section(report.get("check")),
        decode_section(report),
        ops_section(report),
        f'<script type="application/json" id="hx-data">{data}</script>',
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
