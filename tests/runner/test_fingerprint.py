from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hyperexport.runner.fingerprint import (
    code_fingerprint,
    environment_fingerprint,
    module_fingerprint,
    weights_fingerprint,
)
from hyperexport.runner.hashing import FileDigestIndex


def test_environment_fingerprint_reads_versions_without_importing() -> None:
    fp = environment_fingerprint()
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


def test_installed_distribution_by_record(tmp_path: Path) -> None:
    fp = module_fingerprint("transformers", FileDigestIndex(None))
    assert fp["kind"] == "dist"
    assert fp["name"] == "transformers"
    assert len(fp["record"]) == 64


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
    assert "hyperexport" in before
    (pkg / "net.py").write_text("SCALE = 2\n")
    os.utime(pkg / "net.py", ns=(1, 1))  # mtime changed: the fast path re-hashes
    after = code_fingerprint(["my_models_fp.net.make"], index)
    assert after["my_models_fp"] != before["my_models_fp"]
    assert after["hyperexport"] == before["hyperexport"]


def test_stdlib_and_missing() -> None:
    index = FileDigestIndex(None)
    assert module_fingerprint("json", index) == {"kind": "stdlib"}
    assert module_fingerprint("no_such_module_xyz", index) == {"kind": "missing"}
    assert "no_such_module_xyz" not in sys.modules


def test_checkpoint_fast_path_uses_size_and_mtime(tmp_path: Path) -> None:
    ckpt = tmp_path / "w.safetensors"
    ckpt.write_bytes(b"a" * 100)
    index = FileDigestIndex(tmp_path / "index.json")
    first = weights_fingerprint(None, ckpt, index)
    index.save()
    stat = ckpt.stat()
    # Same size and mtime: the index answers without reading (proved by changing the bytes).
    ckpt.write_bytes(b"b" * 100)
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = weights_fingerprint(None, ckpt, FileDigestIndex(tmp_path / "index.json"))
    assert again == first
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    touched = weights_fingerprint(None, ckpt, FileDigestIndex(tmp_path / "index.json"))
    assert touched != first
    assert list(touched["checkpoint"]) == ["w.safetensors"]
