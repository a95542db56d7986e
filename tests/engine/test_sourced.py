"""Blobs by reference (sourced.py): a large output that copies ranges of a file on disk is
recorded, not copied; a checkout assembles and verifies it; a changed source is a miss."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hyperexport.engine.collector import GcOptions, collect
from hyperexport.engine.errors import StageFailed
from hyperexport.engine.remote import Remote
from hyperexport.engine.sourced import (
    LITERAL_MAX,
    FileSources,
    Piece,
    SourcesError,
    assemble,
    matching_digest,
    merged,
)
from hyperexport.engine.stage import StageInputs
from hyperexport.engine.store import CacheStore, CorruptBlobError
from hyperexport.engine.verify import verify
from hyperexport.engine.workspace import ONE_COPY_MIN, Workspace
from tests.engine.fakes import build, statuses

KEY_A, KEY_B = "aa" * 32, "bb" * 32
HALF = ONE_COPY_MIN // 2 + 3


def _source(tmp_path: Path) -> Path:
    """A 'checkpoint': a header, then two tensors' bytes."""
    path = tmp_path / "src" / "weights.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"HEADER" + os.urandom(HALF) + os.urandom(HALF))
    return path


def _copy_of(source: Path, out: Path) -> tuple[bytes, FileSources]:
    """Write ``out`` as the two tensors of ``source`` in reverse order with zero padding
    between, as an export would; return its bytes and their record."""
    data = source.read_bytes()
    first, second = data[6 : 6 + HALF], data[6 + HALF :]
    pad = b"\0" * 61
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(second + pad + first)
    sources = FileSources(
        size=2 * HALF + len(pad),
        pieces=(
            Piece(0, HALF, str(source), 6 + HALF),
            Piece(HALF + len(pad), HALF, str(source), 6),
        ),
    )
    return out.read_bytes(), sources


def _regular_files_of_size(root: Path, size: int) -> list[Path]:
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.stat().st_size == size
    ]


# -- the record ------------------------------------------------------------------------------
def test_a_record_round_trips_and_assembles_the_file(tmp_path: Path) -> None:
    source = _source(tmp_path)
    data, sources = _copy_of(source, tmp_path / "out" / "w.data")
    again = FileSources.loads(sources.dumps())
    assert again == sources
    with open(tmp_path / "assembled", "wb") as fh:
        digest = assemble(again, fh)
    assert (tmp_path / "assembled").read_bytes() == data
    assert digest == hashlib.sha256(data).hexdigest()
    assert matching_digest(tmp_path / "out" / "w.data", sources) == digest


def test_a_file_that_differs_by_one_byte_does_not_match(tmp_path: Path) -> None:
    source = _source(tmp_path)
    data, sources = _copy_of(source, tmp_path / "w.data")
    changed = bytearray(data)
    changed[HALF + 5] = 1  # in the padding, which the record says is zeros
    (tmp_path / "w.data").write_bytes(bytes(changed))
    assert matching_digest(tmp_path / "w.data", sources) is None


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"format": 2, "size": 1, "sources": [], "pieces": []}, "format"),
        (
            {"format": 1, "size": 10, "sources": ["/a"], "pieces": [[0, 8, 0, 0], [4, 2, 0, 0]]},
            "overlap",
        ),
        ({"format": 1, "size": 4, "sources": ["/a"], "pieces": [[0, 8, 0, 0]]}, "past the file"),
        ({"format": 1, "size": 4, "sources": ["rel/a"], "pieces": [[0, 4, 0, 0]]}, "absolute"),
        ({"format": 1, "size": 4, "sources": [], "pieces": [[0, 4, 0, 0]]}, "bad sources record"),
    ],
)
def test_a_malformed_record_is_refused(record: dict[str, Any], message: str) -> None:
    with pytest.raises(SourcesError, match=message):
        FileSources.loads(json.dumps(record))


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_source_that_is_not_a_regular_file_is_never_read(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(target)  # opening it for reading would block
    elif kind == "symlink":
        _source(tmp_path).rename(tmp_path / "real")
        target.symlink_to(tmp_path / "real")
    else:
        target.mkdir()
    sources = FileSources(4, (Piece(0, 4, str(target), 0),))
    with open(tmp_path / "out", "wb") as fh, pytest.raises((SourcesError, OSError)):
        assemble(sources, fh)


def test_adjacent_pieces_of_one_source_merge() -> None:
    pieces = merged([Piece(10, 5, "/s", 105), Piece(0, 10, "/s", 95), Piece(15, 1, "/t", 0)])
    assert pieces == (Piece(0, 15, "/s", 95), Piece(15, 1, "/t", 0))


# -- the store ---------------------------------------------------------------------------------
def _out(tmp_path: Path, source: Path, name: str = "out") -> tuple[Path, bytes, FileSources]:
    out = tmp_path / name
    data, sources = _copy_of(source, out / "units" / "weights.data")
    (out / "bundle.json").write_text('{"units": 1}')
    return out, data, sources


def test_a_declared_copy_is_recorded_not_copied(store: CacheStore, tmp_path: Path) -> None:
    source = _source(tmp_path)
    out, data, sources = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
        (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
        assert f.digest == hashlib.sha256(data).hexdigest()
        assert not store.blob_path(f.digest).exists()
        assert store.ref_path(f.digest).is_file()
        assert store.has_blob(f)
        # The build's own copy serves its later stages: still one copy of the bytes.
        assert (ws.checkout("export", entry) / "units" / "weights.data").read_bytes() == data
        assert _regular_files_of_size(store.root, len(data)) == [
            ws.checkout("export", entry) / "units" / "weights.data"
        ]
    # A later build assembles its checkout from the source, verified.
    assert store.lookup_local(KEY_A).status == "hit"
    with Workspace(store) as ws:
        assert (ws.checkout("export", entry) / "units" / "weights.data").read_bytes() == data


def test_a_later_stage_passing_the_bytes_on_unchanged_copies_nothing(
    store: CacheStore, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    out, data, sources = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
        inputs = ws.checkout("export", entry)
        rewrite = tmp_path / "rewrite-out"
        rewrite.mkdir()
        (rewrite / "model.onnx.data").symlink_to(inputs / "units" / "weights.data")
        committed = store.commit(KEY_B, "rewrite", rewrite, known=ws.digest_of, keep=ws)
        (f,) = committed.outputs
        assert f.digest == hashlib.sha256(data).hexdigest()
        assert not store.blob_path(f.digest).exists()
        assert len(_regular_files_of_size(tmp_path, len(data))) == 1  # the build's copy


def test_machines_whose_sources_are_at_other_paths_share_a_cache_through_the_bytes(
    store: CacheStore, tmp_path: Path
) -> None:
    """A cache shared by two machines whose checkpoints are at other paths: the first records
    its ranges; the second cannot read them (its lookup misses, it runs the stage again) and
    stores the bytes instead of taking the record; from then on both read the bytes."""
    source = _source(tmp_path / "a")
    out, data, sources = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
    (f,) = [e for e in entry.outputs if e.path == "units/weights.data"]
    elsewhere = tmp_path / "b" / "src" / "weights.bin"  # the same bytes at the other's path
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_bytes(source.read_bytes())
    os.chmod(source, 0o644)
    source.rename(tmp_path / "a" / "moved.bin")  # machine b cannot see machine a's file
    assert store.lookup_local(KEY_A).status == "corrupt"
    out_b, _, sources_b = _out(tmp_path, elsewhere, "out-b")
    with Workspace(store) as ws:
        store.commit(KEY_A, "export", out_b, keep=ws, sources={"units/weights.data": sources_b})
    assert store.blob_path(f.digest).read_bytes() == data  # the bytes, for every machine
    assert store.sources_of(f.digest) == sources  # machine a's record untouched
    assert store.lookup_local(KEY_A).status == "hit"
    (tmp_path / "a" / "moved.bin").rename(source)  # back on machine a: the bytes serve it too
    with Workspace(store) as ws:
        assert (ws.checkout("export", entry) / "units" / "weights.data").read_bytes() == data


def test_a_declaration_that_does_not_hold_is_a_warning_and_a_copy(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _source(tmp_path)
    out, data, sources = _out(tmp_path, source)
    wrong = FileSources(sources.size, (Piece(0, HALF, str(source), 0),))
    with Workspace(store) as ws, caplog.at_level(logging.WARNING):
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": wrong})
    (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
    assert store.blob_path(f.digest).read_bytes() == data
    assert not store.ref_path(f.digest).exists()
    assert "stage export declared where the bytes of units/weights.data are" in caplog.text


def test_a_declaration_carrying_its_writers_digest_is_taken_without_reading_the_file(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer that hashed and compared as it wrote (``hashed_writer.py``) declares the file's
    digest: the commit checks the size and records the file under that digest, trusting the
    bytes (here, deliberately, bytes that are not the sources': the store does not read them).
    A declared digest whose file has another size is checked byte for byte, as any other."""
    source = _source(tmp_path)
    out, data, sources = _out(tmp_path, source)
    wrong = bytes(b ^ 1 for b in data[:16]) + data[16:]
    (out / "units" / "weights.data").write_bytes(wrong)
    vouched = FileSources(sources.size, sources.pieces, hashlib.sha256(data).hexdigest())
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": vouched})
    (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
    assert f.digest == vouched.digest and store.sources_of(f.digest) == sources

    out_b, _, _ = _out(tmp_path, source, "out-b")
    with (out_b / "units" / "weights.data").open("ab") as fh:
        fh.write(b"x")  # another size: read, found not to hold, copied
    with Workspace(store) as ws, caplog.at_level(logging.WARNING):
        entry = store.commit(
            KEY_B, "export", out_b, keep=ws, sources={"units/weights.data": vouched}
        )
    (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
    assert f.digest == hashlib.sha256(data + b"x").hexdigest()
    assert "stage export declared where the bytes of units/weights.data are" in caplog.text


def test_a_declared_digest_must_be_a_sha256() -> None:
    with pytest.raises(SourcesError, match="not a sha256"):
        FileSources(4, (), "abc")


def _recorded(store: CacheStore, tmp_path: Path) -> tuple[Path, Any]:
    source = _source(tmp_path)
    out, _, sources = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
    (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
    return source, (entry, f)


def test_a_changed_source_is_a_miss_and_the_record_goes(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, (entry, f) = _recorded(store, tmp_path)
    data = bytearray(source.read_bytes())
    data[100] ^= 0xFF  # inside a range the record names
    os.chmod(source, 0o644)
    source.write_bytes(bytes(data))
    with (
        Workspace(store) as ws,
        caplog.at_level(logging.WARNING),
        pytest.raises(CorruptBlobError),
    ):
        ws.checkout("export", entry)
    assert "their sources changed" in caplog.text
    assert not store.ref_path(f.digest).exists()
    assert store.lookup_local(KEY_A).status == "corrupt"


def test_a_removed_source_makes_the_lookup_miss(store: CacheStore, tmp_path: Path) -> None:
    source, _ = _recorded(store, tmp_path)
    source.unlink()
    assert store.lookup_local(KEY_A).status == "corrupt"


def test_verify_assembles_records_and_drops_what_no_longer_holds(
    store: CacheStore, tmp_path: Path
) -> None:
    source, (_, f) = _recorded(store, tmp_path)
    assert verify(store, []).corrupt_blobs == 0
    source.write_bytes(source.read_bytes()[:-1] + b"\1")
    result = verify(store, [])
    assert result.corrupt_blobs == 1
    assert "by reference" in result.problems[0]
    assert not store.ref_path(f.digest).exists()


def test_the_collector_removes_an_unreferenced_record(store: CacheStore, tmp_path: Path) -> None:
    _, (_, f) = _recorded(store, tmp_path)
    collect(store, GcOptions(max_size=0, grace=0))
    assert not store.action_path(KEY_A).exists()
    assert not store.ref_path(f.digest).exists()


def test_a_remote_receives_the_assembled_bytes(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    source = _source(tmp_path)
    out, data, sources = _out(tmp_path, source)
    remote_dir = tmp_path / "remote"
    store = CacheStore(tmp_path / "cache", remote=Remote(f"file://{remote_dir}"))
    with Workspace(store) as ws:
        store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
    uploaded = [p for p in remote_dir.rglob("*") if p.is_file() and p.stat().st_size == len(data)]
    assert [p.read_bytes() == data for p in uploaded] == [True]
    assert not list((tmp_path / "cache" / "tmp").glob("assemble-*"))


# -- the runner --------------------------------------------------------------------------------
class _CopyingStage:
    """Writes a copy of ranges of ``source`` and declares where its bytes are (or, with
    ``outside``, declares a file that is not its output)."""

    name = "export"
    version = 1
    upstream: tuple[str, ...] = ()
    reads: tuple[str, ...] = ("opset",)
    needs_model = False
    libraries: tuple[str, ...] = ()
    publish: tuple[str, ...] = ()

    def __init__(self, source: Path, *, outside: bool = False) -> None:
        self.source = source
        self.outside = outside

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"weights": "units/weights.data"}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        path = out_dir / "units" / "weights.data"
        _, sources = _copy_of(self.source, path)
        inputs.declare_sources(self.source if self.outside else path, sources)


class _Reader(_CopyingStage):
    name = "check"
    upstream = ("export",)

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        data = (inputs.dir("export") / "units" / "weights.data").read_bytes()
        (out_dir / "digest.txt").write_text(hashlib.sha256(data).hexdigest())

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"digest": "digest.txt"}


def test_a_stage_declares_its_sources_through_the_runner(tmp_path: Path) -> None:
    source = _source(tmp_path)
    stages = (_CopyingStage(source), _Reader(source))
    first = build(tmp_path / "cache", stages)
    assert statuses(first) == {"export": "ran", "check": "ran"}
    (f,) = first.entries["export"].outputs
    store = CacheStore(tmp_path / "cache")
    assert store.ref_path(f.digest).is_file() and not store.blob_path(f.digest).exists()
    # A rebuild whose check must run again reads the export's bytes assembled from the source.
    store.discard(first.entries["check"].key)
    second = build(tmp_path / "cache", stages)
    assert statuses(second) == {"export": "hit", "check": "ran"}
    assert second.entries["check"].digests() == first.entries["check"].digests()


def test_declaring_a_file_that_is_not_an_output_fails_the_stage(tmp_path: Path) -> None:
    source = _source(tmp_path)
    result = build(tmp_path / "cache", (_CopyingStage(source, outside=True),))
    assert isinstance(result.error, StageFailed)
    assert "which is not one of its outputs" in str(result.error.__cause__)


# -- copies of inputs, with a tail -------------------------------------------------------------
TAIL = b"\x01" * 1000


# -- an input taken over -----------------------------------------------------------------------
class _Appender(_CopyingStage):
    """A rewrite: the export's weights with a tail appended, taken over when it may (else
    copied); declares its data file as that input's bytes and the tail. ``taken.txt`` says
    which it did."""

    name = "rewrite"
    upstream = ("export",)

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"data": "model.onnx.data", "taken": "taken.txt"}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        weights = inputs.dir("export") / "units" / "weights.data"
        data = out_dir / "model.onnx.data"
        taken = inputs.take(weights)
        if taken:
            os.replace(weights, data)
        else:
            data.write_bytes(weights.read_bytes())
        size = data.stat().st_size
        with data.open("ab") as fh:
            fh.write(b"TAIL")
        pieces = (Piece(0, size, str(weights), 0), Piece.literal(size, b"TAIL"))
        inputs.declare_sources(data, FileSources(size + 4, pieces))
        (out_dir / "taken.txt").write_text("yes" if taken else "no")


class _LaterReader(_Reader):
    """Reads the rewrite's data file, and of the export only what ``reads`` names."""

    upstream = ("export", "rewrite")

    def __init__(self, source: Path, reads: tuple[str, ...] | None) -> None:
        super().__init__(source)
        if reads is not None:
            self.upstream_reads = {"export": reads}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        data = (inputs.dir("rewrite") / "model.onnx.data").read_bytes()
        weights = inputs.dir("export") / "units" / "weights.data"
        seen = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else "-"
        (out_dir / "digest.txt").write_text(f"{hashlib.sha256(data).hexdigest()} {seen}")


def test_an_input_no_later_stage_reads_is_taken_over_and_recorded_by_reference(
    tmp_path: Path,
) -> None:
    source = _source(tmp_path)
    expected, _ = _copy_of(source, tmp_path / "expected.data")
    stages = (_CopyingStage(source), _Appender(source), _LaterReader(source, reads=()))
    result = build(tmp_path / "cache", stages)
    assert result.error is None, result.error
    store = CacheStore(tmp_path / "cache")
    f = {o.path: o for o in result.entries["rewrite"].outputs}
    with Workspace(store) as ws:
        folder = ws.checkout("rewrite", result.entries["rewrite"])
        assert (folder / "taken.txt").read_text() == "yes"
        # Moved, appended to, and still recorded as the source's ranges and the tail.
        assert (folder / "model.onnx.data").read_bytes() == expected + b"TAIL"
    assert store.ref_path(f["model.onnx.data"].digest).is_file()
    assert _regular_files_of_size(store.root, len(expected) + 4) == []
    check = result.entries["check"].digests()["digest.txt"]
    text = (store.blob_path(check)).read_text().split()
    assert text == [hashlib.sha256(expected + b"TAIL").hexdigest(), "-"]  # export not read


def test_an_input_a_later_stage_reads_is_copied_not_taken(tmp_path: Path) -> None:
    source = _source(tmp_path)
    expected, _ = _copy_of(source, tmp_path / "expected.data")
    for reads in (None, ("units/*",)):  # every file of the export, or the weights by pattern
        cache = tmp_path / f"cache-{reads is None}"
        stages = (_CopyingStage(source), _Appender(source), _LaterReader(source, reads))
        result = build(cache, stages)
        assert result.error is None, result.error
        store = CacheStore(cache)
        taken = result.entries["rewrite"].digests()["taken.txt"]
        assert store.blob_path(taken).read_text() == "no"
        check = store.blob_path(result.entries["check"].digests()["digest.txt"])
        assert check.read_text().split()[1] == hashlib.sha256(expected).hexdigest()


class _PassOn(_CopyingStage):
    """A rewrite that passes the export's weights on unchanged: its output links to them."""

    name = "rewrite"
    upstream = ("export",)

    def outputs(self, params: Mapping[str, Any]) -> Mapping[str, str]:
        return {"data": "model.onnx.data"}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        (out_dir / "model.onnx.data").symlink_to(inputs.dir("export") / "units" / "weights.data")


class _TakerOfRewrite(_Appender):
    """Takes (or copies) the rewrite's data file: the same bytes as the export's weights."""

    name = "quantize"
    upstream = ("rewrite",)

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        data = inputs.dir("rewrite") / "model.onnx.data"
        taken = inputs.take(data)
        if taken:
            os.replace(data, out_dir / "model.onnx.data")
        else:
            (out_dir / "model.onnx.data").write_bytes(data.read_bytes())
        (out_dir / "taken.txt").write_text("yes" if taken else "no")


def test_a_file_a_later_stage_reads_under_another_checkout_is_not_taken(tmp_path: Path) -> None:
    source = _source(tmp_path)
    expected, _ = _copy_of(source, tmp_path / "expected.data")
    # The rewrite's checkout moves the build's one copy to it and leaves a link in the export's:
    # a later reader of the export's weights reads that same file.
    for later, taken in (((_Reader(source),), "no"), ((), "yes")):
        cache = tmp_path / f"cache-{taken}"
        stages = (_CopyingStage(source), _PassOn(source), _TakerOfRewrite(source), *later)
        result = build(cache, stages)
        assert result.error is None, result.error
        store = CacheStore(cache)
        assert store.blob_path(result.entries["quantize"].digests()["taken.txt"]).read_text() == (
            taken
        )
        if later:
            check = store.blob_path(result.entries["check"].digests()["digest.txt"])
            assert check.read_text() == hashlib.sha256(expected).hexdigest()


def test_upstream_reads_naming_a_stage_not_read_is_refused(tmp_path: Path) -> None:
    source = _source(tmp_path)
    reader = _LaterReader(source, reads=())
    reader.upstream_reads = {"trace": ("*",)}
    with pytest.raises(ValueError, match="upstream_reads names trace, not among its upstream"):
        build(tmp_path / "cache", (_CopyingStage(source), _Appender(source), reader))


def test_literal_pieces_round_trip_and_are_bounded(tmp_path: Path) -> None:
    source = _source(tmp_path)
    sources = FileSources(
        10 + HALF, (Piece(0, HALF, str(source), 6), Piece.literal(HALF + 2, b"abc"))
    )
    again = FileSources.loads(sources.dumps())
    assert again == sources
    with open(tmp_path / "f", "wb") as fh:
        assemble(again, fh)
    assert (tmp_path / "f").read_bytes() == source.read_bytes()[6 : 6 + HALF] + b"\0\0abc" + bytes(
        5
    )
    with pytest.raises(SourcesError, match="literal bytes"):
        FileSources(LITERAL_MAX + 1, (Piece.literal(0, bytes(LITERAL_MAX + 1)),))


def _rewrite_of(store: CacheStore, ws: Workspace, entry: Any, tmp_path: Path) -> tuple[Any, bytes]:
    """Commit a 'rewrite' whose data file clones the export's and appends :data:`TAIL`,
    declared as the input's bytes plus the tail."""
    data_in = ws.checkout("export", entry) / "units" / "weights.data"
    out = tmp_path / "rewrite-out"
    out.mkdir()
    data = data_in.read_bytes() + TAIL
    (out / "model.onnx.data").write_bytes(data)
    n = len(data) - len(TAIL)
    declared = FileSources(len(data), (Piece(0, n, str(data_in), 0), Piece.literal(n, TAIL)))
    committed = store.commit(
        KEY_B,
        "rewrite",
        out,
        known=ws.digest_of,
        keep=ws,
        sources={"model.onnx.data": declared},
    )
    return committed.outputs[0], data


def test_a_copy_of_an_input_blob_plus_a_tail_is_recorded_against_that_blob(
    store: CacheStore, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    out, _, _ = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws)  # no declaration: a real blob
        f, data = _rewrite_of(store, ws, entry, tmp_path)
    assert not store.blob_path(f.digest).exists()
    record = store.sources_of(f.digest)
    assert record is not None
    (export_file,) = [e for e in entry.outputs if e.path == "units/weights.data"]
    assert record.blobs() == {export_file.digest}  # symbolic: survives the cache's move
    with Workspace(store) as ws:
        rewrite = store.read_entry(KEY_B)
        assert (ws.checkout("rewrite", rewrite) / "model.onnx.data").read_bytes() == data
    # The collector keeps the blob while a record reads it, and removes both after.
    store.discard(KEY_A)
    collect(store, GcOptions(grace=0))
    assert store.blob_path(export_file.digest).is_file()
    store.discard(KEY_B)
    collect(store, GcOptions(grace=0))
    assert not store.blob_path(export_file.digest).exists()
    assert not store.ref_path(f.digest).exists()


def test_a_copy_of_an_input_held_by_reference_is_recorded_against_its_sources(
    store: CacheStore, tmp_path: Path
) -> None:
    source = _source(tmp_path)
    out, _, sources = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws, sources={"units/weights.data": sources})
        f, data = _rewrite_of(store, ws, entry, tmp_path)
    record = store.sources_of(f.digest)
    assert record is not None and record.blobs() == set()
    assert {p.source for p in record.pieces if p.data is None} == {str(source)}
    assert _regular_files_of_size(store.root, len(data)) == []
    with Workspace(store) as ws:
        got = ws.checkout("rewrite", store.read_entry(KEY_B)) / "model.onnx.data"
        assert got.read_bytes() == data


def test_a_copy_of_an_input_the_store_lost_is_stored_as_a_copy(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _source(tmp_path)
    out, _, _ = _out(tmp_path, source)
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws)
        (export_file,) = [e for e in entry.outputs if e.path == "units/weights.data"]
        ws.checkout("export", entry)
        os.chmod(store.blob_path(export_file.digest), 0o644)
        store.blob_path(export_file.digest).unlink()
        with caplog.at_level(logging.WARNING):
            f, data = _rewrite_of(store, ws, entry, tmp_path)
    assert "in the cache neither as bytes nor ranges" in caplog.text
    assert store.blob_path(f.digest).read_bytes() == data
