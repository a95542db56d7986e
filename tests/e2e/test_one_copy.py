"""A model's external data, held at most twice by the cache and the outputs (issue 12).

A real build (torch, the exporter, ONNX Runtime) of the toy package with ``external_data: true``
and a data file over ``workspace.ONE_COPY_MIN``. The disk is inspected at every point where the
old runner held extra copies: as each stage starts and ends, after each commit (the stage's
scratch still there) and right after publishing (the build's checkouts still there). On this
machine's ext4 there are no reflinks, so every clone is a full copy, and the counts are real.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.engine import store as store_mod
from hyperexport.engine.collector import GcOptions, collect
from hyperexport.engine.store import CacheStore
from hyperexport.engine.verify import verify
from hyperexport.engine.workspace import ONE_COPY_MIN
from hyperexport.product.builds import publish as publish_mod
from hyperexport.product.builds import session
from hyperexport.product.stages import PIPELINE
from tests.helpers.builds import build, toy_package_in, toy_package_recipe
from tests.helpers.statuses import statuses

DATA = "model.onnx.data"
RAN_ALL = dict.fromkeys(STAGE_NAMES, "ran")
HIT_ALL = dict.fromkeys(STAGE_NAMES, "hit")


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


def _recipe(pkg: Path) -> Any:
    # Two 512x512 float32 blocks: a 2.1 MB data file, over ONE_COPY_MIN.
    return toy_package_recipe(pkg, model__dim=512, inputs__x__shape=[2, 512], external_data=True)


def _regular_files(root: Path) -> dict[tuple[int, int], tuple[str, int]]:
    """Every regular file under ``root`` of at least ONE_COPY_MIN bytes, one per inode."""
    found: dict[tuple[int, int], tuple[str, int]] = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size >= ONE_COPY_MIN:
                found.setdefault((st.st_dev, st.st_ino), (path, st.st_size))
    return found


class _Watch:
    """Snapshots of the large regular files under ``root`` at named points of a build, and the
    full copies of large files (``shutil.copyfile``, which ``clone_or_copy`` falls back to, and
    ``clone_or_copy_hashed`` where the cache and publishing call it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.snapshots: list[tuple[str, dict[tuple[int, int], tuple[str, int]]]] = []
        self.copies: list[tuple[str, str, int]] = []

    def snap(self, point: str) -> None:
        self.snapshots.append((point, _regular_files(self.root)))

    def holding(self, size: int) -> dict[str, list[str]]:
        """``{point: paths of the regular files of exactly size bytes}`` at every snapshot."""
        return {
            point: sorted(p for p, s in files.values() if s == size)
            for point, files in self.snapshots
        }


@pytest.fixture
def watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _Watch:
    seen = _Watch(tmp_path)
    for stage in PIPELINE:
        cls = type(stage)
        original = cls.run

        def run(self: Any, params: Any, inputs: Any, out_dir: Path, _run: Any = original) -> None:
            seen.snap(f"{self.name} starts")
            _run(self, params, inputs, out_dir)
            seen.snap(f"{self.name} ends")

        monkeypatch.setattr(cls, "run", run)
    commit = CacheStore.commit

    def committed(self: CacheStore, key: str, stage: str, out_dir: Path, **kw: Any) -> Any:
        entry = commit(self, key, stage, out_dir, **kw)
        seen.snap(f"{stage} committed")
        return entry

    monkeypatch.setattr(CacheStore, "commit", committed)
    publish = session.publish_build

    def published(*args: Any, **kw: Any) -> Any:
        publication = publish(*args, **kw)
        seen.snap("published")
        return publication

    monkeypatch.setattr(session, "publish_build", published)
    copyfile: Callable[..., Any] = shutil.copyfile

    def counting(src: Any, dst: Any, **kw: Any) -> Any:
        result = copyfile(src, dst, **kw)
        if os.path.getsize(dst) >= ONE_COPY_MIN:
            seen.copies.append((str(src), str(dst), os.path.getsize(dst)))
        return result

    monkeypatch.setattr(shutil, "copyfile", counting)
    for module in (store_mod, publish_mod):
        hashed: Callable[..., Any] = module.clone_or_copy_hashed

        def counting_hashed(src: Any, dst: Any, _copy: Any = hashed) -> Any:
            result = _copy(src, dst)
            if os.path.getsize(dst) >= ONE_COPY_MIN:
                seen.copies.append((str(src), str(dst), os.path.getsize(dst)))
            return result

        monkeypatch.setattr(module, "clone_or_copy_hashed", counting_hashed)
    return seen


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_data_file_is_held_at_most_twice_at_every_point_of_a_build(
    toy_package: Path, tmp_path: Path, watch: _Watch
) -> None:
    outcome = build(_recipe(toy_package), tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    assert statuses(outcome) == RAN_ALL
    assert outcome.report is not None
    record = outcome.report["files"][DATA]
    size, digest = record["size"], record["digest"]
    assert size >= ONE_COPY_MIN
    holding = watch.holding(size)
    assert {p for p, paths in holding.items() if paths}  # the watch saw the file
    too_many = {point: paths for point, paths in holding.items() if len(paths) > 2}
    assert not too_many, too_many
    # Copied once: the export's file into the cache, hashed on the way. The export's own file
    # is the build's copy: moved to the rewrite's checkout (the rewrite's output is a link to
    # it), then into the outputs. Nothing is copied out of the cache.
    copies = [c for c in watch.copies if c[2] == size]
    assert len(copies) == 1, watch.copies
    assert "/tmp/export-" in copies[0][0] and "/blobs/" in copies[0][1], copies
    # The export's weight file and the model's data file are one blob.
    cache = CacheStore(tmp_path / "cache")
    export = outcome.result.entries["export"].digests()
    assert export["units/weights.data"] == digest
    blobs = [p for _, p in cache.blob_paths() if p.stat().st_size == size]
    assert blobs == [cache.blob_path(digest)]
    assert _sha256(blobs[0]) == digest
    # The published file is a regular file of its own (it outlives cache gc), the blob's bytes.
    published = outcome.out_dir / DATA
    st = os.lstat(published)
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1
    assert st.st_ino != blobs[0].stat().st_ino
    assert published.read_bytes() == blobs[0].read_bytes()
    assert stat.S_IMODE(st.st_mode) == 0o644
    # ORT parity: the check stage ran on the model and its data file, and passed.
    assert outcome.report["check"]["ok"] is True
    # Nothing is left in scratch: no checkout, no stage folder.
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    assert holding["published"] == sorted([str(blobs[0]), str(published.resolve())])


def test_rebuilds_are_byte_identical_and_cache_commands_work(
    toy_package: Path, tmp_path: Path, watch: _Watch
) -> None:
    first = build(_recipe(toy_package), tmp_path / "a")
    assert first.exit_code == 0, first.lines
    again = build(_recipe(toy_package), tmp_path / "a")
    assert statuses(again) == HIT_ALL
    other = build(_recipe(toy_package), tmp_path / "b")  # from an empty cache
    assert statuses(other) == RAN_ALL
    for name in ("model.onnx", DATA):
        assert (first.out_dir / name).read_bytes() == (other.out_dir / name).read_bytes()
    store = CacheStore(tmp_path / "a" / "cache")
    checked = verify(store, PIPELINE)
    assert checked.ok and checked.corrupt_blobs == 0, checked.problems
    assert checked.entries == len(STAGE_NAMES)
    # gc may take everything: the published files are regular files and stay intact.
    published = first.out_dir / DATA
    want = published.read_bytes()
    result = collect(store, GcOptions(max_size=0, grace=0))
    assert len(result.evicted) == len(STAGE_NAMES) and not list(store.blob_paths())
    assert published.read_bytes() == want
    watch.copies.clear()
    rebuilt = build(_recipe(toy_package), tmp_path / "a")
    assert statuses(rebuilt) == RAN_ALL
    assert (rebuilt.out_dir / DATA).read_bytes() == want
    # Rebuilt into the layout gc and verify know: one blob, copied out of the cache once (the
    # checkout copy; the outputs already hold these bytes, so publishing copies nothing).
    assert [c[2] for c in watch.copies if c[2] == len(want)] == [len(want)], watch.copies
    assert [p for _, p in store.blob_paths() if p.stat().st_size == len(want)]
    assert verify(store, PIPELINE).ok


def test_a_check_only_rebuild_moves_its_checkout_into_the_outputs(
    toy_package: Path, tmp_path: Path, watch: _Watch
) -> None:
    """The check reruns on cached export and rewrite entries: one copy out of the cache, which
    becomes the new publication's file (the previous publication is still there until the
    link swaps: three files at that moment, by the atomic-publishing rule)."""
    first = build(_recipe(toy_package), tmp_path)
    assert first.report is not None
    size = first.report["files"][DATA]["size"]
    watch.copies.clear()
    recipe = toy_package_recipe(
        toy_package,
        model__dim=512,
        inputs__x__shape=[2, 512],
        external_data=True,
        check__atol=1e-3,
    )
    again = build(recipe, tmp_path)
    assert statuses(again) == {**HIT_ALL, "check": "ran"}
    assert [c[2] for c in watch.copies if c[2] == size] == [size]
    holding = watch.holding(size)
    assert len(holding["check starts"]) == 3  # blob, the check's checkout, the old outputs
    assert (again.out_dir / DATA).read_bytes() == (first.out_dir / DATA).read_bytes()
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
