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
fields removed (``normalized``), and otherwise listed as expected to differ. Exit 0 when every
other file, every normalized report and every exit code is the same.
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
    data.get("recipe", {}).pop("file", None)
    model = data.get("recipe", {}).get("config", {}).get("model", {})
    # A recipe may name a moved module by its new path; the factory's last name stays.
    if isinstance(model, dict) and isinstance(model.get("_target_"), str):
        model["_target_"] = model["_target_"].rsplit(".", 1)[-1]
    data["stages"] = [
        {k: v for k, v in s.items() if k not in ("key", "seconds", "reason")}
        for s in data.get("stages", [])
    ]
    text = json.dumps(data, sort_keys=True)
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
                    files["report.json (normalized)"] = _normalized_report(path)
        found[link.name] = files
    return found


def recipes_of(tree: Path) -> list[str]:
    return sorted(p.stem for p in (tree / "recipes").glob("*.yaml"))


def build_tree(tree: Path, out: Path, only: list[str] | None) -> int:
    tree = tree.resolve()
    results: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    results.setdefault("tree", str(tree))
    runs = results.setdefault("runs", {})
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as tmp:
        cache = Path(tmp) / "cache"
        for recipe in only or recipes_of(tree):
            for label, dynamo in PATHS:
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
    same = volatile = 0
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
                if rel in VOLATILE:
                    volatile += 1
                    continue
                if fa.get(rel) != fb.get(rel):
                    problems.append(f"{name} {link}/{rel}: {fa.get(rel)} -> {fb.get(rel)}")
                else:
                    same += 1
    print(
        f"{len(a)} builds before, {len(b)} after; {same} published files identical, "
        f"{volatile} run-specific files (keys, timings, paths) not compared raw"
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
    c = sub.add_parser("compare", help="compare two build results")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        return build_tree(args.tree, args.json, args.recipes)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
