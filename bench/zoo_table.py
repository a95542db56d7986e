"""The zoo table (docs/building.md): every recipes/zoo_*.yaml on both export paths.

    python bench/zoo_table.py --measure     # build and time every zoo recipe (about 10 min),
                                            # write bench/zoo_table.json, then the docs' table
    python bench/zoo_table.py               # rewrite the table of docs/building.md from the committed JSON

Per recipe and path, in one process: a build through the stage runner on a fresh cache (its
check gives the ORT max diff against torch, its report the functions and what ``hiera: auto``
chose), then export time against a plain ``torch.onnx.export`` of the same model, inputs and
dynamic dims, side by side: the CPU time (``time.process_time``, torch on one thread) of
``export_hyper_onnx`` over that of the plain export, best of ``--repeat`` after a warm-up
export of each kind. A pair listed in ``hyperexport.zoo.EXPECTED_FAILURES`` (the installed
transformers' expected failures, whose release the JSON records) is recorded with its reason
instead.

``tests/zoo/test_zoo_table.py`` fails when the table in the docs differs from what this script
renders from the recipes and the committed JSON (a recipe added, removed or changed without a
new measurement).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TABLE_DOC = REPO / "docs" / "building.md"
RESULTS = REPO / "bench" / "zoo_table.json"
START, END = "<!-- zoo-table:start -->", "<!-- zoo-table:end -->"
PATHS = (("torchscript", False), ("dynamo", True))


def zoo_recipes() -> list[str]:
    """The zoo's recipe names, sorted (the forward zoo: ``zoo_*_generate`` recipes build a
    generation step model and the encoder-decoders two graphs, both checked by decoding;
    tests/generation and tests/seq2seq cover them)."""
    from hyperexport.product.config import RECIPES_DIR
    from hyperexport.zoo import forward_zoo

    return forward_zoo(RECIPES_DIR)


def architecture(name: str) -> str:
    """What the table shows from the recipe alone: the architecture."""
    from hyperexport.product.config import compose_recipe

    recipe, _ = compose_recipe([f"recipe={name}"])
    model = recipe.data["model"]
    arch = str(model.get("model_class", model["_target_"].rsplit(".", 1)[-1]))
    if model.get("submodule"):
        arch += f".{model['submodule']}"
    return arch


def paths_column(entry: Mapping[str, Any]) -> str:
    """The paths a recipe was measured on, each marked where the measurement expected it to fail
    (the expected failures of the releases it was measured with, not of those installed now)."""
    return ", ".join(
        label + (" (expected to fail)" if (entry.get(label) or {}).get("expected_failure") else "")
        for label, _ in PATHS
    )


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------
def _build(name: str, dynamo: bool, root: Path) -> dict[str, Any]:
    from hyperexport.product.builds.session import run_build
    from hyperexport.product.config import compose_recipe
    from hyperexport.product.stages import PIPELINE, model_loader

    recipe, settings = compose_recipe(
        [
            f"recipe={name}",
            f"dynamo={str(dynamo).lower()}",
            f"build.cache_dir={root / 'cache'}",
            f"build.outputs_dir={root / 'out'}",
        ]
    )
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    report = outcome.report or {}
    if outcome.exit_code != 0:
        return {"ok": False, "error": str(outcome.result.error).splitlines()[0][:300]}
    outputs = report["check"]["end_to_end"]["outputs"]
    auto = json.loads((outcome.out_dir / "auto.json").read_text())
    classes = sorted({f["class"].rsplit(".", 1)[-1] for f in report["functions"]})
    return {
        "ok": True,
        "max_abs": max(o["max_abs"] for o in outputs),
        "functions": len(report["functions"]),
        "classes": classes,
        # A recipe that lists its hiera classes (the MoE ones) has none in auto.json.
        "hiera": [h.rsplit(".", 1)[-1] for h in auto["hiera"] or recipe.data["hiera"]],
        "hiera_reason": auto["hiera_reason"],
        "inputs": {k: v["shape"] for k, v in auto["inputs"].items()},
        "recipe": recipe,
    }


def _timed(run: Callable[[], None], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def _export_times(recipe: Any, dynamo: bool, repeat: int) -> tuple[float, float]:
    """CPU seconds of a plain torch.onnx.export and of export_hyper_onnx, same model and inputs.

    Both export the model behind a wrapper that takes the inputs positionally (the TorchScript
    exporter passes keyword inputs as a trailing dict, which transformers' forward refuses).
    """
    import torch

    from hyperexport import export_hyper_onnx
    from hyperexport.library.capture.model_patches import export_context
    from hyperexport.library.models.auto import resolve_auto
    from hyperexport.library.models.inputs import make_inputs
    from hyperexport.product.from_recipe.model import load_model, resolve_classes

    model = load_model(recipe.data["model"], recipe.checkpoint, recipe.file)
    data = resolve_auto(recipe.data, model, recipe.file)
    inputs = make_inputs(data["inputs"])
    names = list(inputs)
    args = tuple(inputs[n] for n in names)
    axes = {k: {int(a): d for a, d in s["dynamic"].items()} for k, s in data["inputs"].items()}
    hiera = resolve_classes(data["hiera"], recipe.file)
    wrapped = _positional(model, names).eval()

    def plain() -> None:
        kwargs: dict[str, Any] = {"opset_version": 18, "input_names": names}
        if dynamo:
            # One entry, for forward's *args.
            kwargs["dynamic_shapes"] = (
                tuple({a: torch.export.Dim.AUTO for a in axes[n]} for n in names),
            )
        else:
            kwargs["dynamic_axes"] = axes
        with export_context(model, dynamo=dynamo), torch.no_grad():
            torch.onnx.export(wrapped, args, io.BytesIO(), dynamo=dynamo, **kwargs)

    def hier() -> None:
        export_hyper_onnx(
            wrapped,
            args,
            io.BytesIO(),
            input_names=names,
            hiera=hiera,
            dynamo=dynamo,
            opset_version=18,
            dynamic_axes=axes,
        )

    plain()  # warm-up of each kind: first exports pay one-off costs
    hier()
    return _timed(plain, repeat), _timed(hier, repeat)


def _positional_class() -> type:
    import torch

    class Positional(torch.nn.Module):
        """``model(**dict(zip(names, args)))``: the model with its inputs taken positionally."""

        def __init__(self, model: torch.nn.Module, names: list[str]) -> None:
            super().__init__()
            self.model = model
            self.names = names

        def forward(self, *args: torch.Tensor) -> Any:
            return self.model(**dict(zip(self.names, args)))

    return Positional


def _positional(model: Any, names: list[str]) -> Any:
    return _positional_class()(model, names)


def measure(names: list[str], repeat: int) -> dict[str, Any]:
    """Build and time ``names`` on both paths; the results as JSON-able data."""
    import torch

    from hyperexport.zoo import EXPECTED_FAILURES

    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {}
        for label, dynamo in PATHS:
            reason = EXPECTED_FAILURES.get((name, dynamo))
            if reason:
                entry[label] = {"ok": False, "expected_failure": reason}
                continue
            with tempfile.TemporaryDirectory(prefix="zoo-table-") as tmp:
                built = _build(name, dynamo, Path(tmp))
            if built.pop("ok"):
                recipe = built.pop("recipe")
                plain, hier = _export_times(recipe, dynamo, repeat)
                built.update(ok=True, plain_cpu_s=round(plain, 3), hyper_cpu_s=round(hier, 3))
            entry[label] = built
            print(f"{name} {label}: {json.dumps(built)[:300]}", flush=True)
        results[name] = entry
    return results


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------
def _cell(result: Mapping[str, Any] | None, kind: str) -> str:
    if result is None:
        return "not measured"
    if not result.get("ok"):
        return "xfail¹" if result.get("expected_failure") else "FAILED"
    if kind == "diff":
        return f"{result['max_abs']:.1e}"
    return f"{result['hyper_cpu_s'] / result['plain_cpu_s']:.2f}"


def render_table(names: list[str], results: Mapping[str, Any]) -> str:
    """The markdown table (between the doc's markers) for ``names`` and ``results``."""
    lines = [
        "| recipe | architecture | paths | hiera: auto | functions | ORT max diff "
        "(TorchScript / dynamo) | export CPU time vs plain (TorchScript / dynamo) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes: dict[str, str] = {}
    for name in names:
        entry = results.get(name, {})
        ts, dy = entry.get("torchscript"), entry.get("dynamo")
        first = ts if ts and ts.get("ok") else dy if dy and dy.get("ok") else None
        hiera = ", ".join(first["hiera"]) if first else "-"
        functions = f"{first['functions']}" if first else "-"
        for (label, _), r in zip(PATHS, (ts, dy)):
            if r and r.get("expected_failure"):
                path = "TorchScript" if label == "torchscript" else label
                notes[f"`{name}` on the {path} path"] = r["expected_failure"]
        lines.append(
            f"| `{name}` | {architecture(name)} | {paths_column(entry)} | {hiera} | {functions} "
            f"| {_cell(ts, 'diff')} / {_cell(dy, 'diff')} "
            f"| {_cell(ts, 'time')} / {_cell(dy, 'time')} |"
        )
    for where, reason in notes.items():
        lines.append("")
        lines.append(f"¹ {where}: {reason}.")
    return "\n".join(lines)


def doc_table(text: str) -> str:
    """The table currently between the doc's markers."""
    start, end = text.index(START) + len(START), text.index(END)
    return text[start:end].strip("\n")


def write_doc(table: str) -> None:
    text = TABLE_DOC.read_text(encoding="utf-8")
    start, end = text.index(START) + len(START), text.index(END)
    from hyperexport.base.atomic import atomic_write_text

    atomic_write_text(TABLE_DOC, f"{text[:start]}\n{table}\n{text[end:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="build and time (slow)")
    parser.add_argument("--recipes", nargs="*", help="measure only these (default: the zoo)")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per export (best of)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    names = zoo_recipes()
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"recipes": {}}
    if args.measure:
        measured = measure(args.recipes or names, args.repeat)
        results["recipes"].update(measured)
        results["recipes"] = {k: results["recipes"][k] for k in names if k in results["recipes"]}
        import torch

        from hyperexport.base.versions import transformers_version

        results["environment"] = {
            "date": time.strftime("%Y-%m-%d"),
            "torch": torch.__version__,
            # The zoo's expected failures depend on it (hyperexport.zoo.expected_failures).
            "transformers": transformers_version(),
            "threads": 1,
            "repeat": args.repeat,
        }
        from hyperexport.base.atomic import atomic_write_text

        atomic_write_text(RESULTS, json.dumps(results, indent=1, sort_keys=True) + "\n")
    write_doc(render_table(names, results["recipes"]))
    print(f"docs/building.md zoo table: {len(names)} recipes")
    failed = [
        f"{name} {label}"
        for name, entry in results["recipes"].items()
        for label, r in entry.items()
        if not r.get("ok") and not r.get("expected_failure")
    ]
    if failed:
        print(f"unexpected failures: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
