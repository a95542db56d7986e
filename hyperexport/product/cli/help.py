"""``hyperexport --help``: the front door, printed without importing Hydra, torch or a recipe.

It lists the subcommands, the recipes of ``recipes/`` with the first line of each file's
comment, and the overrides people use every day, and points to Hydra's own help
(``--hydra-help``) and to the composed config (``--cfg job``). The recipe bases
(``recipes/base/``) are building blocks of recipes, not recipes, so they are not listed.
"""

from __future__ import annotations

from pathlib import Path

from hyperexport.base.contracts.names import STAGE_NAMES

#: ``(command, what it does)`` of every subcommand ``__main__`` dispatches.
SUBCOMMANDS_HELP = (
    (
        "cache",
        "inspect and manage the build cache: status, ls, show, verify, gc, clean, push, pull",
    ),
    ("show", "print the function hierarchy of an .onnx file"),
    ("lock", "write hyperexport.lock: what CI builds, its inputs' and artifacts' digests"),
)

#: ``(override, what it does)``: the overrides of a day's work. Any recipe field is
#: overridable by its short name; recipes/README.md documents every field.
COMMON_OVERRIDES = (
    ("recipe=NAME", "build recipes/NAME.yaml (default: tiny_llama)"),
    ("recipe_file=/abs/path.yaml", "build a recipe kept outside recipes/"),
    ("opset=18", "the ONNX opset of the export"),
    ("dynamo=true", "export with torch.export instead of TorchScript"),
    ("functions=per_type", "one function per module structure (default per_instance)"),
    ("hiera=[pkg.mod.Class]", "the module classes that become ONNX functions (or auto)"),
    ("check.atol=1e-3 check.rtol=1e-2", "the check's tolerances (re-judges only, no rebuild)"),
    ("build.dry_run=true", "say what would run, and why; write nothing"),
    ("build.force=[export]", "rerun named stages (or all) even when cached"),
    (
        "build.cache_dir=DIR",
        "the cache (default $HYPEREXPORT_CACHE_DIR, else ~/.cache/hyperexport)",
    ),
    ("build.outputs_dir=DIR", "where artifacts go: <DIR>/<recipe>/<overrides or default>/"),
    ("build.remote=s3://bucket/prefix", "a shared remote cache tier (any fsspec URL)"),
    ("build.remote_mode=read_only", "look up the remote but never upload (CI of forks)"),
    ("-m opset=17,18", "a sweep: one build per value"),
    ("-m hydra/launcher=joblib hydra.launcher.n_jobs=2", "run a sweep's jobs in parallel"),
)

_EXIT_CODES = (
    "exit codes: 0 built, 1 a stage failed, 2 invalid recipe or override, "
    "3 cache/outputs unusable, 130 Ctrl-C"
)


#: Longest recipe summary shown; longer first sentences are cut at a word, with an ellipsis.
SUMMARY_WIDTH = 72


def recipe_summaries(recipes_dir: Path) -> list[tuple[str, str]]:
    """``(name, summary)`` of each selectable recipe (``recipes_dir/*.yaml``), sorted by name.

    The summary is the first sentence of the file's leading comment. Only the top-level files
    are recipes; ``recipes_dir/base/`` holds the bases they extend.
    """
    out = []
    for path in sorted(recipes_dir.glob("*.yaml")):
        words: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            text = line.lstrip("#").strip()
            if not text.startswith("@package"):
                words += text.split()
        out.append((path.stem, _first_sentence(" ".join(words))))
    return out


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    sentence = text if end < 0 else text[: end + 1]
    if len(sentence) <= SUMMARY_WIDTH:
        return sentence
    return sentence[: SUMMARY_WIDTH - 1].rsplit(" ", 1)[0].rstrip(",;:(") + "…"


def _rows(
    rows: list[tuple[str, str]] | tuple[tuple[str, str], ...], indent: str = "  "
) -> list[str]:
    width = max((len(a) for a, _ in rows), default=0)
    return [f"{indent}{a.ljust(width)}  {b}".rstrip() for a, b in rows]


def render_help(recipes_dir: Path) -> str:
    """The text of ``hyperexport --help``."""
    lines = [
        "usage: hyperexport [recipe=NAME] [FIELD=VALUE ...] [build.*=VALUE ...]",
        "       hyperexport -m [FIELD=V1,V2 ...]          (a sweep)",
        "       hyperexport {cache,show,lock} ...         (see hyperexport COMMAND --help)",
        "",
        "Build hierarchical ONNX models from recipes: " + " -> ".join(STAGE_NAMES) + ",",
        "each stage cached by what it depends on. Artifacts: outputs/<recipe>/<variant>/.",
        "",
        "commands:",
        *_rows(SUBCOMMANDS_HELP),
        "",
        "recipes (recipe=NAME; recipes/README.md documents every field):",
        *_rows(recipe_summaries(recipes_dir)),
        "",
        "common overrides (any recipe field by its short name, build settings as build.*):",
        *_rows(COMMON_OVERRIDES),
        "",
        "more:",
        *_rows(
            (
                ("--hydra-help", "Hydra's own help (its flags: --cfg, --multirun, --info, ...)"),
                ("recipe=NAME --cfg job", "print the composed recipe with every field"),
                ("--version", "hyperexport's version"),
            )
        ),
        "",
        _EXIT_CODES,
    ]
    return "\n".join(lines) + "\n"
