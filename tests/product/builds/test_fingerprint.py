from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from hyperexport.engine import hashing
from hyperexport.engine.environment import environment_fingerprint
from hyperexport.engine.hashing import FileDigestIndex
from hyperexport.product.builds.fingerprint import (
    ENV_DISTRIBUTIONS,
    code_fingerprint,
    model_argument_files,
    model_fingerprint,
    module_fingerprint,
    package_modules,
    weights_fingerprint,
)


def test_environment_fingerprint_reads_versions_without_importing() -> None:
    fp = environment_fingerprint(ENV_DISTRIBUTIONS)
    assert set(fp["packages"]) == {
        "torch",
        "onnx",
        "onnxscript",
        "onnx-ir",
        "onnxruntime",
        "transformers",
        "hyperexport",
    }
    assert fp["packages"]["hyperexport"] is not None


def test_installed_distribution_by_its_package_files(tmp_path: Path) -> None:
    fp = module_fingerprint("transformers", FileDigestIndex(None))
    assert fp["kind"] == "dist"
    assert fp["name"] == "transformers"
    assert len(fp["files"]) == 64


def _fake_install(site: Path, script: str, module: str) -> None:
    """Distribution ``hxf-dist`` in ``site`` as pip lays it out: a package, its dist-info, and
    a RECORD that lists a console script whose text names the virtualenv's Python."""
    (site / "hxf_pkg").mkdir(parents=True, exist_ok=True)
    (site / "hxf_pkg" / "__init__.py").write_text(module)
    info = site / "hxf_dist-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hxf-dist\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("hxf_pkg\n")
    digest = hashing.sha256_text(module)
    (info / "RECORD").write_text(
        f"hxf_pkg/__init__.py,sha256={digest},{len(module)}\n"
        "hxf_pkg/__pycache__/__init__.cpython-311.pyc,,\n"
        f"../../../bin/hxf,sha256={hashing.sha256_text(script)},{len(script)}\n"
        "hxf_dist-1.0.dist-info/RECORD,,\n"
        f"hxf_dist-1.0.dist-info/direct_url.json,sha256={hashing.sha256_text(str(site))},9\n"
    )


def test_what_the_installer_wrote_for_the_machine_is_not_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: RECORD's digest of a console script (``#!/path/to/venv/bin/python``) made two
    virtualenvs of one stack key the same model differently."""
    found = {}
    for venv, module in (("a", "GAIN = 1\n"), ("bb", "GAIN = 1\n"), ("c", "GAIN = 2\n")):
        site = tmp_path / venv / "lib" / "site-packages"
        _fake_install(site, f"#!{tmp_path / venv}/bin/python\nimport hxf_pkg\n", module)
        monkeypatch.syspath_prepend(str(site))
        for name in [m for m in sys.modules if m == "hxf_pkg"]:
            del sys.modules[name]
        found[venv] = module_fingerprint("hxf_pkg", FileDigestIndex(None))
        monkeypatch.undo()
    assert found["a"]["kind"] == "dist" and found["a"]["version"] == "1.0"
    assert found["a"] == found["bb"]  # other paths, other scripts: the same package
    assert found["a"] != found["c"]  # another package file: another key


def test_local_module_digest_follows_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "my_models_fp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    index = FileDigestIndex(None)
    before = code_fingerprint(["my_models_fp.net.make"], index)
    assert before["my_models_fp"]["kind"] == "local"
    assert "hyperexport" not in before  # the stages key the hyperexport code they run
    (pkg / "net.py").write_text("SCALE = 2\n")
    after = code_fingerprint(["my_models_fp.net.make"], index)
    assert after["my_models_fp"] != before["my_models_fp"]


def test_a_factory_inside_hyperexport_joins_the_stage_code() -> None:
    paths = ["hyperexport.zoo.tiny_llama", "transformers.models.llama.X", "hyperexport.a:b"]
    assert code_fingerprint(paths, FileDigestIndex(None)).keys() == {"transformers"}
    assert package_modules(paths) == ("hyperexport.a", "hyperexport.zoo")


def test_stdlib_and_missing() -> None:
    index = FileDigestIndex(None)
    assert module_fingerprint("json", index) == {"kind": "stdlib"}
    assert module_fingerprint("no_such_module_xyz", index) == {"kind": "missing"}
    assert "no_such_module_xyz" not in sys.modules


def test_checkpoint_fast_path_skips_unchanged_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "w.safetensors"
    ckpt.write_bytes(b"a" * 100)
    index = FileDigestIndex(tmp_path / "index.json")
    first = weights_fingerprint(None, ckpt, index)
    index.save()
    hashed: list[Path] = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda p: hashed.append(p) or real(p))
    monkeypatch.setattr(hashing, "_PROCESS_DIGESTS", {})  # as in a new process
    again = weights_fingerprint(None, ckpt, FileDigestIndex(tmp_path / "index.json"))
    assert again == first
    assert hashed == []  # answered from the persisted index


def test_one_process_hashes_a_file_once_for_every_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two caches (two in-memory indexes) in one process: the second asks the process's
    digests; a file rewritten in place since is read again."""
    ckpt = tmp_path / "w.safetensors"
    ckpt.write_bytes(b"a" * 100)
    monkeypatch.setattr(hashing, "_PROCESS_DIGESTS", {})
    hashed: list[Path] = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda p: hashed.append(p) or real(p))
    first = FileDigestIndex(None).digest_at(str(ckpt))
    assert FileDigestIndex(None).digest_at(str(ckpt)) == first
    assert len(hashed) == 1
    stat = ckpt.stat()
    ckpt.write_bytes(b"b" * 100)  # same size; restore the mtime: ctime still moves
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert FileDigestIndex(None).digest_at(str(ckpt)) == real(ckpt) != first
    assert len(hashed) == 2


def test_swapped_checkpoint_with_mtime_restored_is_rehashed(tmp_path: Path) -> None:
    """``cp -p`` / ``rsync -t``: same size, same mtime, other bytes."""
    ckpt = tmp_path / "w.safetensors"
    ckpt.write_bytes(b"a" * 100)
    index = FileDigestIndex(tmp_path / "index.json")
    first = weights_fingerprint(None, ckpt, index)
    index.save()
    stat = ckpt.stat()
    ckpt.write_bytes(b"b" * 100)  # in place: same inode, ctime moves
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    in_place = weights_fingerprint(None, ckpt, FileDigestIndex(tmp_path / "index.json"))
    assert in_place != first
    other = tmp_path / "other"
    other.write_bytes(b"c" * 100)
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(other, ckpt)  # replaced: another inode
    replaced = weights_fingerprint(None, ckpt, FileDigestIndex(tmp_path / "index.json"))
    assert replaced not in (first, in_place)
    assert list(replaced["checkpoint"]) == ["w.safetensors"]


def test_old_index_entries_are_misses(tmp_path: Path) -> None:
    ckpt = tmp_path / "w.bin"
    ckpt.write_bytes(b"x" * 10)
    stat = ckpt.stat()
    old = {str(ckpt.resolve()): [stat.st_size, stat.st_mtime_ns, "0" * 64]}
    (tmp_path / "index.json").write_text(json.dumps(old))
    digest = FileDigestIndex(tmp_path / "index.json").digest(ckpt)
    assert digest == hashing.sha256_file(ckpt)


def test_model_argument_files_are_keyed_by_content(tmp_path: Path) -> None:
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()
    (pretrained / "config.json").write_text("{}")
    (pretrained / "model.safetensors").write_bytes(b"w" * 10)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\n")
    cfg = {"_target_": "x.y", "path": "pretrained", "name": "relu", "nested": {"f": [str(recipe)]}}
    files = model_argument_files(cfg, str(recipe))
    assert files == {"model.path": pretrained, "model.nested.f.0": recipe}
    index = FileDigestIndex(None)
    data = {"model": cfg, "hiera": [], "custom_ops": []}
    fp = model_fingerprint(data, str(recipe), None, index)
    assert sorted(fp["files"]["model.path"]) == ["config.json", "model.safetensors"]
    (pretrained / "config.json").write_text('{"a": 1}')
    assert model_fingerprint(data, str(recipe), None, index) != fp


def test_a_readme_or_image_beside_a_pretrained_folder_is_not_keyed(tmp_path: Path) -> None:
    """Issue 24: a README.md added to a from_pretrained folder reran all five stages."""
    from hyperexport.product.builds.fingerprint import path_digests

    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modeling_x.py"):
        (folder / name).write_text(name)
    before = path_digests(folder, FileDigestIndex(None))
    assert sorted(before) == ["config.json", "model.safetensors", "modeling_x.py", "tokenizer.json"]
    (folder / "README.md").write_text("notes")
    (folder / "picture.png").write_bytes(b"\x89PNG")
    assert path_digests(folder, FileDigestIndex(None)) == before
    (folder / "generation_config.json").write_text("{}")
    assert "generation_config.json" in path_digests(folder, FileDigestIndex(None))


def test_pretrained_patterns_cover_transformers_own_file_names() -> None:
    import fnmatch

    import transformers.utils as tu
    from transformers import LlamaTokenizerFast

    from hyperexport.product.builds.fingerprint import PRETRAINED_FILES

    names = [
        tu.CONFIG_NAME,
        tu.GENERATION_CONFIG_NAME,
        tu.SAFE_WEIGHTS_NAME,
        tu.SAFE_WEIGHTS_INDEX_NAME,
        tu.WEIGHTS_NAME,
        tu.WEIGHTS_INDEX_NAME,
        *LlamaTokenizerFast.vocab_files_names.values(),
        "special_tokens_map.json",
        "tokenizer_config.json",
    ]
    for name in names:
        assert any(fnmatch.fnmatch(name, p) for p in PRETRAINED_FILES), name


def test_a_checkpoint_folder_counts_only_the_files_its_loader_reads(tmp_path: Path) -> None:
    from hyperexport.product.builds.fingerprint import weights_fingerprint

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"w")
    before = weights_fingerprint(0, folder, FileDigestIndex(None))
    (folder / "README.md").write_text("notes")
    assert weights_fingerprint(0, folder, FileDigestIndex(None)) == before


@pytest.mark.parametrize("target", ["/etc/passwd", "empty_folder"])
def test_a_checkpoint_that_is_not_one_is_refused_by_validation(tmp_path: Path, target: str) -> None:
    """Issue 21: checkpoint=../../../../etc/passwd gave rc 1 "list index out of range"."""
    from hyperexport.base.errors import RecipeError
    from hyperexport.product.config import validate_recipe
    from tests.helpers.fake_recipe import recipe

    path = target if target.startswith("/") else str(tmp_path / target)
    if not target.startswith("/"):
        Path(path).mkdir()
    data = dict(recipe().data)
    data["checkpoint"] = path
    with pytest.raises(RecipeError) as raised:
        validate_recipe(data, str(tmp_path / "r.yaml"))
    assert raised.value.field == "checkpoint"


def test_a_nested_target_is_keyed_as_the_model_s_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config object built for the factory (``model.config._target_``) is code the recipe
    names: keyed before the build, as the factory is, not only discovered after it."""
    (tmp_path / "hxn_configs.py").write_text("def make(width=4):\n    return {'width': width}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = {
        "model": {
            "_target_": "hyperexport.zoo.tiny_llama",
            "config": {"_target_": "hxn_configs.make", "width": 8},
            "extras": [{"_target_": "json.loads", "s": "1"}],
        },
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
    }
    from hyperexport.product.builds.fingerprint import model_imports

    imports = model_imports(data)
    assert imports[:3] == ["hyperexport.zoo.tiny_llama", "hxn_configs.make", "json.loads"]
    code = code_fingerprint(imports, FileDigestIndex(None))
    assert code["hxn_configs"]["kind"] == "local" and code["json"] == {"kind": "stdlib"}
