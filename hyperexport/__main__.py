"""Command line: ``python -m hyperexport [recipe=NAME] [FIELD=VALUE ...] [build.*=...]``.

Examples::

    python -m hyperexport                                 # the embedded tiny Llama recipe
    python -m hyperexport recipe=llama opset=17           # short overrides of recipe fields
    python -m hyperexport -m recipe=llama opset=17,18     # a sweep: one build per value
    python -m hyperexport -m hydra/launcher=joblib hydra.launcher.n_jobs=2 recipe=llama opset=17,18
    python -m hyperexport recipe_file=/abs/my_recipe.yaml # a recipe outside the repository
    python -m hyperexport build.dry_run=true              # what would run, and why
    python -m hyperexport build.force=[export]            # rerun named stages

Subcommands (``python -m hyperexport <command> ...``) that are not builds:

    python -m hyperexport cache status|ls|show|verify|gc|clean ...   # hyperexport.product.cli.cache
    python -m hyperexport show model.onnx                            # hyperexport.product.cli.show
    python -m hyperexport lock [--build]                             # hyperexport.product.cli.lock_command
    python -m hyperexport --version
    python -m hyperexport --help        # this front door (hyperexport.product.cli.help); --hydra-help: Hydra's

The build itself is :mod:`hyperexport.product.cli.build`. The ``hyperexport`` console script is the same
entry point. Exit codes are those of
:mod:`hyperexport.base.exit_codes`: 0 built, 1 a stage failed, 2 the recipe or an override is invalid,
3 the cache or outputs cannot be used, 130 interrupted.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from hyperexport.base import exit_codes
from hyperexport.base.cache_dir import default_cache_dir
from hyperexport.engine.keyed_imports import default_bytecode_dir, keyed_imports

log = logging.getLogger("hyperexport")

#: Subcommands: ``{name: module}``; each module has ``main(argv: list[str]) -> int``.
SUBCOMMANDS = {
    "cache": "hyperexport.product.cli.cache",
    "show": "hyperexport.product.cli.show",
    "lock": "hyperexport.product.cli.lock_command",
}
#: The one line printed on Ctrl-C.
INTERRUPTED_MESSAGE = "interrupted (Ctrl-C): stopped; nothing half-written was published"
#: The one line printed on SIGTERM (sent by CI runners and SLURM at a timeout).
TERMINATED_MESSAGE = "terminated (SIGTERM): stopped; nothing half-written was published"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, like Ctrl-C: every cleanup that Ctrl-C runs
    (scratch folders, an unfinished publication) runs for it too."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hyperexport")
    except PackageNotFoundError:
        from hyperexport import __version__

        return __version__


def _run(args: list[str]) -> int:
    if args[:1] == ["--version"]:
        print(f"hyperexport {_version()}")
        return exit_codes.OK
    import importlib

    if args[:1] not in ([c] for c in SUBCOMMANDS) and ("--help" in args or "-h" in args):
        from hyperexport.product.cli.help import render_help
        from hyperexport.product.config.paths import RECIPES_DIR

        print(render_help(RECIPES_DIR), end="")
        return exit_codes.OK
    if args and args[0] in SUBCOMMANDS:
        command = importlib.import_module(SUBCOMMANDS[args[0]])
        return int(command.main(args[1:]))
    from hyperexport.product.cli import build

    return build.main(args)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m hyperexport`` and of the ``hyperexport`` console script."""
    import signal
    import threading

    args = list(sys.argv[1:] if argv is None else argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        # Everything the command imports from here on runs from the source its keys hash
        # (engine/keyed_imports.py); both modules use the standard library only.
        with keyed_imports(default_bytecode_dir(default_cache_dir())):
            code = _run(args)
    except Terminated:
        sys.stdout.flush()
        print(f"[ERROR] {TERMINATED_MESSAGE}", file=sys.stderr)
        code = exit_codes.TERMINATED
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"[ERROR] {INTERRUPTED_MESSAGE}", file=sys.stderr)
        code = exit_codes.INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    sys.exit(code)


if __name__ == "__main__":
    main()
