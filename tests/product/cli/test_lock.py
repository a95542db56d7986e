"""``hyperexport lock`` and ``cache status --lock``: the committed lock is fresh, a change of
what a variant depends on makes it stale with the reason, and ``--build`` records artifacts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hyperexport.base import versions
from hyperexport.engine.environment import environment_fingerprint
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.product.cli import lock_command, lock_file

TWO_VARIANTS = """\
variants:
  - {recipe: tiny_llama}
  - {recipe: tiny_llama, overrides: [opset=17]}
"""


def _lock(tmp_path: Path, *args: str) -> int:
    config = tmp_path / "lock.yaml"
    if not config.exists():
        config.write_text(TWO_VARIANTS)
    return lock_command.main(
        ["--lock-file", str(tmp_path / "x.lock"), "--config", str(config), *args]
    )


def _status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = lock_command.status_lock(tmp_path / "x.lock", tmp_path / "lock.yaml")
    return code, capsys.readouterr().out


REPO = Path(__file__).resolve().parents[3]


def _pins() -> dict[str, str]:
    """``{name: version}`` of constraints.txt."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if "==" in spec:
            name, version = spec.split("==", 1)
            pins[re.sub(r"[-_.]+", "-", name.strip()).lower()] = version.strip()
    return pins


def test_constraints_pin_every_version_the_lock_records() -> None:
    """Issue 32: constraints.txt pinned torch only while the lock recorded every library, so
    any new release made the committed lock stale on a fresh machine."""
    pins = _pins()
    for entry in lock_file.read_lock().values():
        for name, version in entry.inputs["versions"].items():
            if name != "python":
                assert pins.get(name) == version, f"constraints.txt: {name}=={version}"


@pytest.mark.pinned_stack
def test_the_committed_lock_is_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    """Regenerate with `python -m hyperexport lock` (and commit) when this fails.

    It fails, rather than skipping, on an environment other than the pinned stack: the lock is
    the promise that a machine which installs ``constraints.txt`` rebuilds nothing. The legs of
    the version matrix (``noxfile.py``) deselect it with ``-m "not pinned_stack"``.
    """
    assert lock_file.LOCK_FILE.is_file()
    locked = next(iter(lock_file.read_lock().values())).inputs["versions"]
    current = environment_fingerprint([n for n in locked if n != "python"])
    found = {"python": current["python"], **current["packages"]}
    differ = [f"{n} {locked[n]}→{found[n]}" for n in sorted(locked) if locked[n] != found[n]]
    assert not differ, (
        "this environment is not the pinned stack: "
        + ", ".join(differ)
        + ' (pip install -c constraints.txt -e ".[dev]")'
    )
    code = lock_command.status_lock()
    assert code == 0, capsys.readouterr().out


def test_a_stale_lock_names_the_variant_and_the_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _lock(tmp_path) == 0
    text = (tmp_path / "x.lock").read_text()
    data = json.loads(text)
    assert sorted(data["variants"]) == ["tiny_llama/default", "tiny_llama/opset=17"]
    assert text == lock_file.render_lock(lock_file.read_lock(tmp_path / "x.lock"))  # sorted, stable
    assert data["variants"]["tiny_llama/opset=17"]["fields"]["opset"] == 17
    for path in (Path.home(), tmp_path):  # nothing of the machine: no value names a path there
        assert f'"{path}/' not in text and f'"{path}"' not in text
    # Every field some stage reads, though a later stage reads only part of its section.
    fields = data["variants"]["tiny_llama/default"]["fields"]
    assert fields["rewrite"]["fold_leftovers"] is False and fields["rewrite"]["fuse"] == "none"
    assert fields["attention"] == {"implementation": None}
    assert _status(tmp_path, capsys)[0] == 0

    (tmp_path / "lock.yaml").write_text(TWO_VARIANTS.replace("opset=17", "opset=16"))
    code, out = _status(tmp_path, capsys)
    assert code == 1
    assert "tiny_llama/opset=16" in out and "not in hyperexport.lock" in out
    assert "tiny_llama/opset=17" in out and "no longer built" in out

    entries = lock_file.read_lock(tmp_path / "x.lock")
    entries["tiny_llama/default"].inputs["fields"]["opset"] = 19
    entries["tiny_llama/default"].inputs["versions"]["onnx"] = "0.0"
    lock_file.write_lock(entries, tmp_path / "x.lock")
    code, out = _status(tmp_path, capsys)
    default = versions.torchscript_opset(DEFAULT_OPSET)  # tiny_llama leaves opset unset
    assert f"opset 19→{default}" in out and "onnx 0.0→" in out

    # Reasons name what changed, as a build's do: the source file, the weights' seed.
    assert _lock(tmp_path) == 0
    entries = lock_file.read_lock(tmp_path / "x.lock")
    entries["tiny_llama/default"].inputs["sources"]["hyperexport/library/check/judge.py"] = "0" * 64
    entries["tiny_llama/default"].inputs["stages"]["check"]["code"] = "0" * 64
    entries["tiny_llama/default"].inputs["model"]["weights"]["seed"] = 7
    lock_file.write_lock(entries, tmp_path / "x.lock")
    code, out = _status(tmp_path, capsys)
    assert code == 1
    assert "hyperexport code changed (library/check/judge.py)" in out
    assert "weights.seed 7→" in out

    assert _lock(tmp_path) == 0
    assert _status(tmp_path, capsys)[0] == 0


def test_the_fields_are_every_field_any_stage_reads() -> None:
    """Stages read parts of one group: quantize all of ``quantize``, evaluate its method;
    rewrite all of ``rewrite``, check ``rewrite.fuse``. The lock held the last stage's part
    only, so a change of ``quantize.exclude`` or of a rewrite option left it fresh."""
    fields = lock_file.variant_inputs(lock_file.Variant("tiny_llama"))["fields"]
    assert {"method", "block_size", "exclude"} <= set(fields["quantize"])
    assert {"fuse", "fold_leftovers", "optimize"} <= set(fields["rewrite"])
    assert set(fields["attention"]) == {"implementation"}


def test_a_bad_variant_list_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "lock.yaml").write_text("variants:\n  - {recipe: no_such_recipe}\n")
    assert _lock(tmp_path) == 2
    assert "variants[0].recipe" in capsys.readouterr().err


@pytest.mark.slow
def test_build_records_the_published_artifacts(tmp_path: Path) -> None:
    (tmp_path / "lock.yaml").write_text("variants:\n  - {recipe: tiny_llama}\n")
    args = ["--build", "--cache-dir", str(tmp_path / "c"), "--outputs-dir", str(tmp_path / "o")]
    assert _lock(tmp_path, *args) == 0
    entry = lock_file.read_lock(tmp_path / "x.lock")["tiny_llama/default"]
    published = tmp_path / "o" / "tiny_llama" / "default"
    from hyperexport.engine.hashing import sha256_file

    assert "model.onnx" in entry.artifacts
    assert entry.artifacts["model.onnx"] == sha256_file(published / "model.onnx")
    assert _lock(tmp_path) == 0  # inputs unchanged: the artifacts are kept without building
    assert lock_file.read_lock(tmp_path / "x.lock")["tiny_llama/default"].artifacts == (
        entry.artifacts
    )
