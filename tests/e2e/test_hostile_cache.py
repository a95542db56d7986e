"""Cache contents are data: a planted entry naming code never runs it, and the build heals.

The payload is the one from issue 10: a capture record whose tree names ``subprocess.Popen``
with ``shell=True``. Before the fix, the export stage imported that class and called it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hyperexport.base.contracts.records import tree_from_json
from hyperexport.base.errors import CorruptRecordError
from hyperexport.engine.store import CacheStore
from hyperexport.library.capture import tree
from tests.helpers.builds import build, toy_package_in
from tests.helpers.builds import toy_package_recipe as toy_recipe
from tests.helpers.statuses import statuses


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


def _popen_node(marker: Path) -> list[object]:
    return [
        "object",
        "subprocess.Popen",
        [["args", ["const", f"touch {marker}"]], ["shell", ["const", True]]],
    ]


def test_unflatten_refuses_a_class_that_was_never_registered(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = tree_from_json(_popen_node(marker))
    with pytest.raises(CorruptRecordError, match=r"subprocess\.Popen"):
        tree.unflatten(planted, lambda k: None)
    assert not marker.exists()


@dataclasses.dataclass
class _Pair:
    first: torch.Tensor
    second: torch.Tensor


def test_unflatten_rebuilds_classes_flattened_in_this_process() -> None:
    tensors: list[torch.Tensor] = []
    t = tree.flatten(_Pair(torch.ones(1), torch.zeros(1)), "x", tensors)
    rebuilt = tree.unflatten(t, lambda k: tensors[int(k)])
    assert isinstance(rebuilt, _Pair) and torch.equal(rebuilt.first, torch.ones(1))
    # Field names are checked against the class: data cannot pass other keyword arguments.
    bad = ("object", t[1], (("first", ("const", 1)), ("shell", ("const", True))))
    with pytest.raises(CorruptRecordError, match="unknown fields"):
        tree.unflatten(bad, lambda k: None)


def test_unflatten_rebuilds_model_outputs_registered_with_torch_pytree() -> None:
    from transformers.modeling_outputs import BaseModelOutput

    name = tree.qualified_name(BaseModelOutput)
    t = ("object", name, (("last_hidden_state", ("tensor", "0")),))
    rebuilt = tree.unflatten(t, lambda k: torch.ones(2))
    assert isinstance(rebuilt, BaseModelOutput)


def _plant(store: CacheStore, key: str, edit: Callable[[dict[str, Any]], bytes]) -> None:
    """Rewrite the trace entry ``key`` with ``edit(capture)`` as its ``capture.json``: a new
    blob with a matching digest, and an entry pointing at it (what a hostile writer would do)."""
    path = store.action_path(key)
    data = json.loads(path.read_text())
    for item in data["outputs"]:
        if item[0] == "capture.json":
            raw = edit(json.loads(store.blob_path(item[1]).read_text()))
            digest = hashlib.sha256(raw).hexdigest()
            blob = store.blob_path(digest)
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(raw)
            item[1], item[2] = digest, len(raw)
    path.chmod(0o644)
    path.write_text(json.dumps(data))
    assert store.lookup(key).status == "hit"  # the planted entry is well formed


def _with_popen(marker: Path) -> Callable[[dict[str, Any]], bytes]:
    def edit(capture: dict[str, Any]) -> bytes:
        # An extra argument of the first hiera call: its unit's export rebuilds the inputs.
        capture["calls"][0]["inputs"][1].append(["shell_cmd", _popen_node(marker)])
        return json.dumps(capture).encode()

    return edit


def test_planted_popen_payload_runs_nothing_and_the_entry_is_rebuilt(
    toy_package: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "payload-ran"
    first = build(toy_recipe(toy_package), tmp_path)
    assert first.exit_code == 0
    trace_key = first.result.entries["trace"].key
    store = CacheStore(tmp_path / "cache")
    _plant(store, trace_key, _with_popen(marker))
    with caplog.at_level(logging.WARNING):
        again = build(toy_recipe(toy_package, opset=16), tmp_path)  # export must run
    assert not marker.exists(), "the payload ran"
    assert again.exit_code == 0, again.lines
    assert statuses(again) == {
        "trace": "ran",
        "export": "ran",
        "rewrite": "ran",
        "quantize": "ran",
        "evaluate": "ran",
        "check": "ran",
    }
    assert "subprocess.Popen" in caplog.text and "rebuilding" in caplog.text
    # The planted entry is gone; the trace entry of this build is a fresh, clean capture.
    rebuilt = again.result.entries["trace"]
    planted = store.lookup(trace_key)
    assert planted.status == "missing" or planted.entry == rebuilt
    assert store.lookup(rebuilt.key).status == "hit"
    assert "Popen" not in (store.read_text(rebuilt, "capture.json") or "")
    assert again.report is not None and again.report["check"]["ok"] is True


def test_malformed_capture_with_a_matching_digest_is_rebuilt(
    toy_package: Path, tmp_path: Path
) -> None:
    first = build(toy_recipe(toy_package), tmp_path)
    trace_key = first.result.entries["trace"].key
    store = CacheStore(tmp_path / "cache")
    _plant(store, trace_key, lambda capture: b'{"calls": []}')
    again = build(toy_recipe(toy_package, opset=16), tmp_path)
    assert again.exit_code == 0, again.lines
    assert statuses(again)["trace"] == "ran"
