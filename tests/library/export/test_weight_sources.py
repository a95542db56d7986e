"""``WeightFile`` with a locator: the tensors it writes from a file on disk are recorded, and
their assembly (the stage's ``file_sources``) is the written file, byte for byte, padding
included; a tensor it cannot place is named, and its bytes are held by the record (up to the
record's limit). The file's digest comes with the sources when every copy was compared as it was
written; a tensor changed after loading is written from memory and named, not placed."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
import torch

from hyperexport.engine.sourced import LITERAL_MAX, assemble, matching_digest
from hyperexport.library.export.weights import (
    StoredBytes,
    WeightFile,
    storage_key,
    torch_tensor,
)
from hyperexport.product.stages.export import file_sources


def _stored(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, StoredBytes]:
    """Write ``tensors`` one after the other into one file, after a 100-byte header."""
    source = tmp_path / "source.bin"
    where: dict[str, StoredBytes] = {}
    with open(source, "wb") as f:
        f.write(b"h" * 100)
        for name, t in tensors.items():
            data = t.contiguous().view(torch.uint8).numpy().tobytes()
            where[name] = StoredBytes(str(source.resolve()), f.tell(), len(data))
            f.write(data)
    return where


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "big": torch.randn(600, 512, generator=g),  # > 1 MiB: aligned to 64 KiB
        "small": torch.randn(300, generator=g),  # aligned to 64 bytes
        "half": torch.randn(40, 40, generator=g).to(torch.float16),
    }


def _write(
    path: Path, tensors: dict[str, torch.Tensor], stored: dict[str, StoredBytes]
) -> WeightFile:
    keys = {storage_key(t): stored[n] for n, t in tensors.items() if n in stored}
    with WeightFile(path, lambda t: keys.get(storage_key(t))) as data_file:
        for name, t in tensors.items():
            data_file.reference(torch_tensor(t, name), name)
            data_file.reference(torch_tensor(t, name), name)  # once per storage
    return data_file


def test_the_recorded_pieces_assemble_the_written_file(tmp_path: Path) -> None:
    tensors = _tensors()
    data_file = _write(tmp_path / "weights.data", tensors, _stored(tmp_path, tensors))
    found = data_file.sources()
    assert found is not None and data_file.unplaced == []
    assert [stored.nbytes for _, stored in found.copies] == [t.nbytes for t in tensors.values()]
    sources = file_sources(found, tmp_path / "weights.data")
    assert sources is not None
    written = (tmp_path / "weights.data").read_bytes()
    assert sources.size == len(written)
    assert sources.covered < len(written)  # the padding is zeros, in no piece
    assembled = io.BytesIO()
    assert assemble(sources, assembled) == hashlib.sha256(written).hexdigest()
    assert assembled.getvalue() == written
    assert (
        matching_digest(tmp_path / "weights.data", sources) == hashlib.sha256(written).hexdigest()
    )
    assert found.digest == sources.digest == hashlib.sha256(written).hexdigest()


def test_a_tensor_changed_after_loading_is_written_from_memory_and_not_placed(
    tmp_path: Path,
) -> None:
    tensors = _tensors()
    stored = _stored(tmp_path, tensors)
    tensors["half"][3, 5] += 1  # the model's copy no longer is the stored one
    data_file = _write(tmp_path / "weights.data", tensors, stored)
    assert data_file.unplaced == ["half"]
    found = data_file.sources()
    assert found is not None and [s.nbytes for _, s in found.copies] == [
        tensors["big"].nbytes,
        tensors["small"].nbytes,
    ]
    written = (tmp_path / "weights.data").read_bytes()
    assert found.digest == hashlib.sha256(written).hexdigest()
    (offset, length), *_ = found.unplaced
    assert written[offset : offset + length] == tensors["half"].view(torch.uint8).numpy().tobytes()
    sources = file_sources(found, tmp_path / "weights.data")
    assert sources is not None
    assert matching_digest(tmp_path / "weights.data", sources) == found.digest


def test_adjacent_copies_are_merged(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {f"w{i}": torch.randn(256, generator=g) for i in range(3)}  # 1 KiB: no padding
    data_file = _write(tmp_path / "weights.data", tensors, _stored(tmp_path, tensors))
    found = data_file.sources()
    assert found is not None and len(found.copies) == 3
    sources = file_sources(found, tmp_path / "weights.data")
    assert (
        sources is not None
        and len(sources.pieces) == 1
        and sources.covered == 3 * 1024 == sources.size
    )


def test_an_unplaced_tensor_is_held_by_the_record(tmp_path: Path) -> None:
    tensors = _tensors()
    stored = _stored(tmp_path, tensors)
    del stored["small"]
    data_file = _write(tmp_path / "weights.data", tensors, stored)
    assert data_file.unplaced == ["small"]
    found = data_file.sources()
    assert found is not None and found.unplaced_bytes == tensors["small"].nbytes
    sources = file_sources(found, tmp_path / "weights.data")
    assert sources is not None
    literal = [p for p in sources.pieces if p.data is not None]
    assert [len(p.data or b"") for p in literal] == [tensors["small"].nbytes]
    written = (tmp_path / "weights.data").read_bytes()
    assert (
        matching_digest(tmp_path / "weights.data", sources) == hashlib.sha256(written).hexdigest()
    )


def test_unplaced_tensors_over_the_records_limit_are_not_declared(tmp_path: Path) -> None:
    tensors = _tensors()
    stored = _stored(tmp_path, tensors)
    del stored["big"]  # 1.2 MB, over LITERAL_MAX
    data_file = _write(tmp_path / "weights.data", tensors, stored)
    found = data_file.sources()
    assert found is not None and found.unplaced_bytes > LITERAL_MAX
    assert file_sources(found, tmp_path / "weights.data") is None


def test_a_tensor_whose_length_is_not_the_stored_one_is_not_placed(tmp_path: Path) -> None:
    tensors = _tensors()
    stored = _stored(tmp_path, tensors)
    stored["half"] = stored["half"]._replace(nbytes=stored["half"].nbytes * 2)  # stored wider
    data_file = _write(tmp_path / "weights.data", tensors, stored)
    assert data_file.unplaced == ["half"]
    found = data_file.sources()
    assert found is not None and found.unplaced_bytes == tensors["half"].nbytes


def test_a_tensor_written_from_a_contiguous_copy_is_not_placed(tmp_path: Path) -> None:
    base = torch.randn(64, 32, generator=torch.Generator().manual_seed(2))
    transposed = base.t()
    stored = _stored(tmp_path, {"t": transposed})
    data_file = _write(tmp_path / "weights.data", {"t": transposed}, stored)
    assert data_file.sources() is None  # nothing placed: nothing to declare
    assert data_file.unplaced == ["t"]


def test_keyed_tensors_are_placed_where_the_caller_says(tmp_path: Path) -> None:
    tensors = _tensors()
    stored = _stored(tmp_path, tensors)
    with WeightFile(tmp_path / "weights.data") as data_file:
        for name, t in tensors.items():
            like = torch_tensor(t, name)
            data_file.reference_keyed(("k", name), lambda t=t: t, like, name, stored[name])
        with pytest.raises(RuntimeError, match="before the file is closed"):
            data_file.sources()
    found = data_file.sources()
    assert found is not None
    digest = hashlib.sha256((tmp_path / "weights.data").read_bytes()).hexdigest()
    sources = file_sources(found, tmp_path / "weights.data")
    assert sources is not None
    assert matching_digest(tmp_path / "weights.data", sources) == digest


def test_without_a_locator_nothing_is_placed(tmp_path: Path) -> None:
    with WeightFile(tmp_path / "weights.data") as data_file:
        data_file.reference(torch_tensor(torch.ones(512), "w"), "w")
    assert data_file.sources() is None and data_file.unplaced == ["w"]
