"""The public homes (``docs/ARCHITECTURE.md``, side ``public``): every name a published model
can record for a class of the library resolves by import, as the same class, and each home only
re-exports.

A published model records ``cls.__module__ + "." + cls.__qualname__`` for the class of every
function (``hyperexport.module_class``) and of every module a dynamo node was traced in
(``pkg.torch.onnx.class_hierarchy``), and TorchScript names its types the same way. The library's
classes pin that name with :func:`hyperexport.library.public.set_module` to the path they had
before the library had its folder, so the published bytes did not move.
"""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest
import torch

import hyperexport
from hyperexport.library.public import set_module

PACKAGE = Path(hyperexport.__file__).parent
LIBRARY = PACKAGE / "library"
#: What the published models of ``recipes/`` recorded before the library had its folder
#: (``bench/compare_trees.py`` found these in their files, or they are their siblings): each
#: must still be recorded, and import, by exactly this name.
RECORDED = {
    "hyperexport.transformers.kv_layers.KVStep",
    "hyperexport.transformers.kv_layers.KVCacheLayer",
    "hyperexport.transformers.seq2seq_layers.Seq2SeqKVStep",
    "hyperexport.transformers.seq2seq_layers.Seq2SeqCacheLayer",
    "hyperexport.transformers.seq2seq_layers.CrossKV",
    "hyperexport.transformers.static_cache.ExplicitKVCacheModel",
    "hyperexport.transformers.static_cache.StaticCache",
    "hyperexport.transformers.static_cache.StaticCacheView",
    "hyperexport.tasks.steps.CausalLMStep",
    "hyperexport.tasks.steps.TextEncoderStep",
    "hyperexport.tasks.steps.SpeechEncoderStep",
    "hyperexport.tasks.steps.DecoderStep",
    "hyperexport.export.dynamo_path._BatchModule",
    "hyperexport.export.units._UnitModule",
    "hyperexport.export.placeholders._CallOriginal",
    "hyperexport.compat.auto_trace._MethodHolder",
    "hyperexport.capture.root.RootHolder",
}
#: What a public home may import at module level besides the library and the base.
THIN_IMPORTS = {"__future__", "typing", "warnings", "importlib", "sys", "collections.abc"}


def _library_classes() -> list[tuple[str, str]]:
    """``(module, class name)`` of every class at the top level of a library module (parsed)."""
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [(module, n.name) for n in tree.body if isinstance(n, ast.ClassDef)]
    return found


def _recordable_classes() -> list[type]:
    """Every ``nn.Module`` and ``torch.Tensor`` subclass the library defines (what a traced or
    exported model can hold, so what a published model can name), and every class it pins."""
    classes = []
    for module, name in _library_classes():
        cls = getattr(importlib.import_module(module), name)
        if issubclass(cls, (torch.nn.Module, torch.Tensor)) or cls.__module__ != module:
            classes.append(cls)
    return classes


def _resolve(recorded: str) -> object:
    module, _, name = recorded.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_recordable_class_of_the_library_resolves_by_its_recorded_name() -> None:
    classes = _recordable_classes()
    names = {f"{c.__module__}.{c.__qualname__}": c for c in classes}
    assert set(names) >= RECORDED, "a class published models recorded is no longer recorded so"
    for recorded, cls in names.items():
        assert not recorded.startswith("hyperexport.library."), f"pin {recorded} (set_module)"
        assert _resolve(recorded) is cls, recorded


@pytest.mark.parametrize("recorded", sorted(RECORDED))
def test_a_name_published_models_recorded_imports(recorded: str) -> None:
    cls = _resolve(recorded)
    assert isinstance(cls, type)
    assert f"{cls.__module__}.{cls.__qualname__}" == recorded


def test_set_module_refuses_a_home_inside_the_library() -> None:
    for module in ("hyperexport.library.tasks.steps", "hyperexport.library", "torch.nn"):
        with pytest.raises(ValueError, match="public home"):
            set_module(module)


def _public_homes() -> list[Path]:
    """The package's modules outside the side folders, ``__main__`` (the command line) aside."""
    folders = ("product", "engine", "library", "base")
    return sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in folders and p.name != "__main__.py"
    )


def _thin_statement(node: ast.stmt) -> bool:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # the docstring
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return module in THIN_IMPORTS or module.startswith(
            ("hyperexport.library", "hyperexport.base", "hyperexport.models")
        )
    if isinstance(node, ast.Import):
        return all(a.name in THIN_IMPORTS for a in node.names)
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.If)):
        return True  # __all__, the lazy table, __version__, TYPE_CHECKING imports
    if isinstance(node, ast.FunctionDef):
        return node.name in ("__getattr__", "lazy_attributes")
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return ast.unparse(node.value.func) == "warnings.warn"
    return False


@pytest.mark.parametrize("path", _public_homes(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_a_public_home_only_re_exports(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert [ast.unparse(n)[:60] for n in tree.body if not _thin_statement(n)] == []


@pytest.mark.parametrize(
    "name",
    [
        "hyperexport.zoo.tiny_llama",
        "hyperexport.models.pretrained",
        "hyperexport.compat.hyperonnx.export_hyper_onnx",
        "hyperexport.transformers.kv_layers.explicit_kv_layers",
        "hyperexport.transformers.static_cache.StaticCache",
    ],
)
def test_the_public_paths_import_without_a_warning(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        value = _resolve(name)
    module, _, attr = name.rpartition(".")
    home = f"hyperexport.library.{module.removeprefix('hyperexport.')}"
    assert value is getattr(importlib.import_module(home), attr)
