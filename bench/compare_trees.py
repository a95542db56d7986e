"""Build every recipe of a source tree on both export paths, and compare two trees' publications.

Usage::

    python bench/compare_trees.py build /work/main --json /tmp/before.json   # tens of minutes
    python bench/compare_trees.py build . --json /tmp/after.json
    python bench/compare_trees.py compare /tmp/before.json /tmp/after.json

``build`` runs, for every ``recipes/*.yaml`` of the tree at its default variant, with
``dynamo=false`` and then ``dynamo=true``, one ``python -m hyperexport`` process with
``PYTHONPATH`` set to the tree and the tree as its working directory (so the tree's own code and
recipes build). The tree gets its own cache (shared by its builds) and every build its own
outputs folder, under a temporary directory. It records the exit code and the sha256 of every
file published under ``<recipe>/<variant>`` and ``<recipe>/<variant>.failed`` (an expected
failure publishes its failing model and report there), by path relative to that link.

``compare`` reports, per recipe and path, the files whose digests differ. ``report.json``,
``report.html`` and ``summary.txt`` hold what a build cannot repeat (stage keys and timings,
absolute paths, the overrides): they are compared by a digest of ``report.json`` with those
fields removed (``normalized``), and otherwise listed as expected to differ.

The dynamo path's models are not reproducible byte for byte across code changes: they hold
torch's stack trace of every node (``pkg.torch.onnx.stack_trace`` metadata: absolute source
paths and line numbers of hyperexport's and the libraries' code), and torch's exporter orders
a unit's initializers by where its tensors sit in memory (the same code in the same process
gives the same order; code that allocates differently before the export, another). So a dynamo
build differs in its ``.onnx`` files and in the files that name them by digest (``check.json``'s
``judged``, ``check.txt``'s ``judged`` lines) from the same model built by other code. Each such
file also gets a normalized digest: of the model without the traces, its initializers (their
bytes read in) and value infos in name order; of the check without the digests of the files it
judged. A file whose raw digest differs but whose normalized digest matches is counted apart.
Exit 0 when every other file, every normalized digest and every exit code is the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PATHS = (("torchscript", "false"), ("dynamo", "true"))
#: The node metadata torch's dynamo exporter writes with source paths and line numbers.
STACK_TRACE = "pkg.torch.onnx.stack_trace"
#: The suffix of a file's normalized digest in the results.
NORMALIZED = " (normalized)"
#: Published files that hold run-specific data (keys, seconds, paths): compared normalized.
VOLATILE = frozenset({"report.json", "report.html", "summary.txt"})


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _normalized_report(path: Path) -> str:
    """The digest of ``report.json`` without what differs between any two runs of one build."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for field in ("artifacts", "cache_dir", "overrides", "environment"):
        data.pop(field, None)
    if data.get("traceback") is None:  # since 9f1482b: null unless an internal error failed it
        data.pop("traceback", None)
    # The files' names stay; their digests and sizes are the files' own comparisons.
    data["files"] = sorted(data.get("files") or {})
    if isinstance(data.get("check"), dict) and isinstance(data["check"].get("judged"), dict):
        data["check"]["judged"] = sorted(data["check"]["judged"])
    data.get("recipe", {}).pop("file", None)
    model = data.get("recipe", {}).get("config", {}).get("model", {})
    # A recipe may name a moved module by its new path; the factory's last name stays.
    if isinstance(model, dict) and isinstance(model.get("_target_"), str):
        model["_target_"] = model["_target_"].rsplit(".", 1)[-1]
    # Timings, the named spans' included (a task's reference decode), differ in every run.
    data["stages"] = [
        {k: v for k, v in s.items() if k not in ("key", "seconds", "reason", "spans")}
        for s in data.get("stages", [])
    ]
    text = json.dumps(data, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _normalized_model(path: Path) -> str:
    """The digest of an ONNX model as a set of facts: without torch's per-node stack traces,
    with its initializers (external data read in) and value infos in name order."""
    import onnx

    model = onnx.load(str(path), load_external_data=True)
    for graph in (model.graph, *model.functions):
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key != STACK_TRACE]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    for field in ("initializer", "value_info", "sparse_initializer"):
        items = sorted(getattr(model.graph, field), key=lambda x: x.name)
        for item in items:
            if field == "initializer":
                del item.external_data[:]
                item.ClearField("data_location")
        del getattr(model.graph, field)[:]
        getattr(model.graph, field).extend(items)
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def _normalized_check(path: Path) -> str:
    """The digest of ``check.json`` without the digests of the files it judged (their names
    stay), or of ``check.txt`` without its ``judged`` lines' digests."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if isinstance(data.get("judged"), dict):
            data["judged"] = sorted(data["judged"])
        text = json.dumps(data, sort_keys=True)
    else:
        text = "\n".join(
            line.split(": sha256 ")[0] if line.startswith("judged ") else line
            for line in text.splitlines()
        )
    return hashlib.sha256(text.encode()).hexdigest()


def published(outputs: Path, recipe: str) -> dict[str, dict[str, str]]:
    """``{link name: {relative path: sha256}}`` of every link under ``outputs/<recipe>``."""
    found: dict[str, dict[str, str]] = {}
    folder = outputs / recipe
    if not folder.is_dir():
        return found
    for link in sorted(folder.iterdir()):
        if link.name.startswith(".") or not link.is_dir():
            continue
        files: dict[str, str] = {}
        for path in sorted(link.rglob("*")):
            if path.is_file():
                rel = path.relative_to(link).as_posix()
                files[rel] = _digest(path)
                if rel == "report.json":
                    files[rel + NORMALIZED] = _normalized_report(path)
                elif path.suffix == ".onnx":
                    files[rel + NORMALIZED] = _normalized_model(path)
                elif path.name in ("check.json", "check.txt"):
                    files[rel + NORMALIZED] = _normalized_check(path)
        found[link.name] = files
    return found


def recipes_of(tree: Path) -> list[str]:
    return sorted(p.stem for p in (tree / "recipes").glob("*.yaml"))


def build_tree(
    tree: Path, out: Path, only: list[str] | None, paths: list[str] | None = None
) -> int:
    tree = tree.resolve()
    results: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    results.setdefault("tree", str(tree))
    runs = results.setdefault("runs", {})
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as tmp:
        cache = Path(tmp) / "cache"
        for recipe in only or recipes_of(tree):
            for label, dynamo in PATHS:
                if paths and label not in paths:
                    continue
                name = f"{recipe}/{label}"
                if name in runs:
                    continue
                outputs = Path(tmp) / "outputs" / label
                start = time.perf_counter()
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "hyperexport",
                        f"recipe={recipe}",
                        f"dynamo={dynamo}",
                        f"build.cache_dir={cache}",
                        f"build.outputs_dir={outputs}",
                    ],
                    cwd=tree,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                seconds = round(time.perf_counter() - start, 1)
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
                runs[name] = {
                    "exit": proc.returncode,
                    "seconds": seconds,
                    "published": published(outputs, recipe),
                    "tail": tail,
                }
                print(f"{name}: exit {proc.returncode} in {seconds}s", flush=True)
                tmp_out = out.with_suffix(".tmp")
                tmp_out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
                os.replace(tmp_out, out)
    return 0


def compare(before: Path, after: Path) -> int:
    a = json.loads(before.read_text())["runs"]
    b = json.loads(after.read_text())["runs"]
    problems: list[str] = []
    same = volatile = traces = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{name}: built in one tree only")
            continue
        ra, rb = a[name], b[name]
        if ra["exit"] != rb["exit"]:
            problems.append(f"{name}: exit {ra['exit']} before, {rb['exit']} after")
        links = set(ra["published"]) | set(rb["published"])
        for link in sorted(links):
            fa, fb = ra["published"].get(link, {}), rb["published"].get(link, {})
            for rel in sorted(set(fa) | set(fb)):
                if rel in VOLATILE or rel.endswith(NORMALIZED):
                    volatile += rel in VOLATILE
                    continue
                if fa.get(rel) == fb.get(rel):
                    same += 1
                    continue
                norm = rel + NORMALIZED
                if norm in fa and fa.get(norm) == fb.get(norm):
                    traces += 1
                    continue
                problems.append(f"{name} {link}/{rel}: {fa.get(rel)} -> {fb.get(rel)}")
            norm = "report.json" + NORMALIZED
            if norm in fa and fa.get(norm) != fb.get(norm):
                problems.append(f"{name} {link}/{norm} differs")
    print(
        f"{len(a)} builds before, {len(b)} after; {same} published files byte-identical, "
        f"{traces} identical as models but not byte for byte (dynamo: torch's stack traces and "
        f"initializer order, and the checks naming those models by digest), {volatile} "
        "run-specific files (keys, timings, paths) compared normalized"
    )
    for line in problems:
        print(f"DIFFERS {line}")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build every recipe of a tree on both paths")
    b.add_argument("tree", type=Path)
    b.add_argument("--json", type=Path, required=True, help="results (resumed if present)")
    b.add_argument("--recipes", nargs="*", help="only these recipes")
    b.add_argument("--paths", nargs="*", choices=[p for p, _ in PATHS], help="only these paths")
    c = sub.add_parser("compare", help="compare two build results")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        return build_tree(args.tree, args.json, args.recipes, args.paths)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
