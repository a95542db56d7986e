"""The sections of ``report.html`` beyond the float model's check: the published models with
their sizes, the fused and quantized op counts, the quantized model's check (and its decode
against the float model's, when ``check.json`` holds one), and the task's decode check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperexport.product.builds.html_parts import escape as _e
from hyperexport.product.builds.html_parts import num_cell as _num
from hyperexport.product.builds.html_parts import status as _status
from hyperexport.product.builds.html_parts import table as _table
from hyperexport.product.builds.summary import model_label, published_models, size_text


def models_section(report: Mapping[str, Any]) -> str:
    """Every published model file, what it is, and its size (with its external data)."""
    rows = [
        f"<tr><td>{_e(m['file'])}</td><td>{_e(model_label(m['artifact'], report))}</td>"
        f'<td class="num">{_e(size_text(m["size"]))}</td></tr>'
        for m in published_models(report)
    ]
    return '<h2 id="models">published models</h2>' + _table(
        ["file", "model", "size (with external data)"], rows, "models-table"
    )


def ops_section(report: Mapping[str, Any]) -> str:
    """Fused kernels (``rewrite.fuse``) and quantized ops, per function."""
    ops = report.get("ops") or {}
    rows = [
        f"<tr><td>{_e(kind)}</td><td>{_e(function)}</td><td>{_e(op)}</td>"
        f'<td class="num">{_e(n)}</td></tr>'
        for kind in ("fused", "quantized")
        for function, counts in sorted((ops.get(kind) or {}).items())
        for op, n in sorted(counts.items())
    ]
    if not rows:
        return ""
    return '<h2 id="ops">op counts</h2>' + _table(["kind", "function", "op", "nodes"], rows)


def quantized_section(check: Mapping[str, Any] | None) -> str:
    """``check.json``'s ``quantized``: the verdict, the thresholds, per output and per function,
    and the quantized decode against the float one when present (``quantized.decode``)."""
    quantized = (check or {}).get("quantized")
    if not isinstance(quantized, Mapping):
        return ""
    comparison = quantized.get("comparison") or {}
    thresholds = ", ".join(
        f"{k} {v}" for k, v in sorted((quantized.get("thresholds") or {}).items())
    )
    failed = "".join(f"<li>{_e(f)}</li>" for f in quantized.get("failed") or [])

    def rows(items: Any) -> list[str]:
        return [
            f"<tr><td>{_e(c.get('name'))}</td><td>{_e(c.get('module_path') or '')}</td>"
            f"{_num(c.get('rel_error'))}{_num(c.get('cosine'))}{_num(c.get('top1'))}"
            f"<td>{_e(c.get('error') or '')}</td></tr>"
            for c in items or []
        ]

    head = ["name", "module", "rel error", "cosine", "top-1", ""]
    return (
        '<section id="quantized-check"><h2>quantized check</h2>'
        f"<p>verdict: {_status(quantized.get('passed'))} "
        f"({_e(comparison.get('method') or '?')} against the float model, both in ONNX Runtime)"
        f"<br>thresholds: {_e(thresholds or '-')}"
        f"<br>largest error: {_e(quantized.get('worst_function') or '-')}</p>"
        + (f'<ul class="bad">{failed}</ul>' if failed else "")
        + "<h3>per output</h3>"
        + _table(head, rows(comparison.get("outputs")))
        + "<h3>per function</h3>"
        + _table(head, rows(comparison.get("functions")))
        + _quantized_decode(quantized.get("decode"))
        + "</section>"
    )


def _quantized_decode(decode: Any) -> str:
    """The quantized model's decode fed the float decode's tokens (``quantized.decode``)."""
    if not isinstance(decode, Mapping):
        return ""
    thresholds = ", ".join(f"{k} {v}" for k, v in sorted((decode.get("thresholds") or {}).items()))
    gate = "gates the check" if decode.get("gate", True) else "reported, not gated"
    rows = [
        f"<tr><td>{_e(s.get('name'))}</td>{_num(s.get('steps'))}{_num(s.get('agreeing_steps'))}"
        f"{_num(s.get('token_agreement'))}{_num(s.get('min_cosine'))}</tr>"
        for s in decode.get("sequences") or []
        if isinstance(s, Mapping)
    ]
    return (
        '<div id="quantized-decode"><h3>decode against the float model</h3>'
        f"<p>verdict: {_status(decode.get('passed'))} ({_e(gate)}; "
        f"{_e(decode.get('runtime') or '-')})<br>token agreement: "
        f"{_e(decode.get('token_agreement'))}, lowest cosine: {_e(decode.get('min_cosine'))}"
        f"<br>thresholds: {_e(thresholds or '-')}</p>"
        + _table(["sequence", "steps", "same token", "agreement", "lowest cosine"], rows)
        + "</div>"
    )


def decode_section(report: Mapping[str, Any]) -> str:
    """The task's decode check (``generation_check.json``, ``seq2seq_check.json``): the exported
    decode against transformers', token by token, and the genai_config.json check."""
    decodes = report.get("decode") or {}
    genai = ((report.get("check") or {}).get("genai_config")) or None
    if not decodes and not genai:
        return ""
    parts = ['<section id="generation-check"><h2>generation check</h2>']
    if isinstance(genai, Mapping):
        problems = "; ".join(genai.get("problems") or [])
        parts.append(
            f"<p>genai_config.json: {_status(genai.get('passed'))}"
            f"{' ' + _e(problems) if problems else ''}</p>"
        )
    for name, data in sorted(decodes.items()):
        if not isinstance(data, Mapping):
            continue
        runtimes = ", ".join(
            str(data[k]) for k in ("runtime", "batch_runtime") if data.get(k) is not None
        )
        rows = []
        for s in data.get("sequences") or []:
            reference = s.get("reference") or []
            first = s.get("first_divergence")
            same = (
                f"{len(reference)} tokens identical"
                if first is None
                else f"diverges at step {first}"
            )
            diffs = s.get("max_diff_per_step") or []
            rows.append(
                f"<tr><td>{_e(s.get('name'))}</td><td>{_e(same)}</td>{_num(s.get('distinct'))}"
                f"{_num(max(diffs) if diffs else None)}{_num(s.get('min_top2_gap'))}"
                f"<td>{_e('; '.join(s.get('problems') or []))}</td></tr>"
            )
        parts.append(
            f"<h3>{_e(name)}.json</h3><p>verdict: {_status(data.get('passed'))} "
            f"(transformers against {_e(runtimes or 'the export')})</p>"
            + _table(
                ["sequence", "tokens", "distinct ids", "max logits diff", "min top-2 gap", ""],
                rows,
            )
        )
    parts.append("</section>")
    return "".join(parts)
