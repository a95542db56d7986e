"""Where every tensor of a safetensors checkpoint is, from the files' headers alone (no torch).

A safetensors file is 8 bytes of little-endian header length N, N bytes of JSON, then the data:
a tensor's bytes start at ``8 + N + data_offsets[0]`` and are ``data_offsets[1] -
data_offsets[0]`` long. :func:`read_weight_index` reads only the headers of a checkpoint
folder's files, so the index of a 16 GB checkpoint costs a few kilobytes of reading. The
:class:`WeightIndex` is a record like the others between stages (JSON, ``format`` checked):
files are named relative to the checkpoint folder, never by an absolute path, and can carry
their content digests, so a record stays valid wherever the folder is and says which bytes it
describes. Streaming builds (``docs/streaming.md``) map the files and take tensors from it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperexport.base.errors import CorruptRecordError

WEIGHT_INDEX_FORMAT = 1
#: The suffix of the files read.
SAFETENSORS_SUFFIX = ".safetensors"
#: transformers' list of a sharded checkpoint's files (``weight_map``: tensor -> file).
SHARD_INDEX_FILE = "model.safetensors.index.json"
#: safetensors refuses headers larger than this (its own limit); so do we.
MAX_HEADER_BYTES = 100_000_000
#: The key of a header's free-form metadata (not a tensor).
_METADATA_KEY = "__metadata__"

#: The floating dtypes a model is loaded in (torch's names) -> safetensors' names.
FLOAT_DTYPE_NAMES: Mapping[str, str] = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}

#: safetensors dtype names -> bytes per element.
ITEM_SIZES: Mapping[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are.

    Attributes:
        file: The safetensors file, relative to the checkpoint folder (POSIX separators).
        dtype: The safetensors dtype name (``BF16``, ``F32``, ...; :data:`ITEM_SIZES`).
        shape: The tensor's shape.
        offset: The first byte, from the start of the file.
        nbytes: The length in bytes (``prod(shape) * item size``).
    """

    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.offset + self.nbytes


@dataclass(frozen=True)
class WeightIndex:
    """Every tensor of a checkpoint by its state-dict name, and the files they are in.

    Attributes:
        tensors: Name -> where its bytes are, in the files' order then the headers' order.
        files: File (relative) -> its sha256, or ``""`` where no digest was computed.
    """

    tensors: Mapping[str, StoredTensor]
    files: Mapping[str, str] = field(default_factory=dict)

    def nbytes(self, names: Iterable[str] | None = None) -> int:
        """The bytes of ``names`` (every tensor when None)."""
        chosen = self.tensors.values() if names is None else (self.tensors[n] for n in names)
        return sum(t.nbytes for t in chosen)

    def layout(self) -> list[list[Any]]:
        """Names, dtypes and shapes, in order: the checkpoint's architecture without its values
        (what two checkpoints of one architecture share)."""
        return [[name, t.dtype, list(t.shape)] for name, t in self.tensors.items()]

    def dumps(self) -> str:
        """Canonical JSON (sorted keys, tensors in the index's order)."""
        return json.dumps(
            {
                "format": WEIGHT_INDEX_FORMAT,
                "files": dict(sorted(self.files.items())),
                "tensors": [
                    [name, t.file, t.dtype, list(t.shape), t.offset, t.nbytes]
                    for name, t in self.tensors.items()
                ],
            },
            sort_keys=True,
        )

    @classmethod
    def loads(cls, text: str, what: str = "weight index") -> WeightIndex:
        """Parse :meth:`dumps`'s output; anything else is a :class:`CorruptRecordError`."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise CorruptRecordError(what, f"not JSON ({e})") from e
        if not isinstance(data, dict) or data.get("format") != WEIGHT_INDEX_FORMAT:
            raise CorruptRecordError(what, f"not a weight index of format {WEIGHT_INDEX_FORMAT}")
        files = data.get("files")
        rows = data.get("tensors")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise CorruptRecordError(what, "'files' is not a mapping of names to digests")
        if not isinstance(rows, list):
            raise CorruptRecordError(what, "'tensors' is not a list")
        tensors: dict[str, StoredTensor] = {}
        for row in rows:
            if not (isinstance(row, list) and len(row) == 6 and isinstance(row[0], str)):
                raise CorruptRecordError(what, f"malformed tensor entry {row!r}")
            name, file, dtype, shape, offset, nbytes = row
            if name in tensors or file not in files:
                raise CorruptRecordError(what, f"tensor {name!r}: repeated, or in no listed file")
            tensors[name] = _stored(what, name, file, dtype, shape, offset, nbytes)
        return cls(tensors, dict(files))


def _stored(
    what: str, name: str, file: Any, dtype: Any, shape: Any, offset: Any, nbytes: Any
) -> StoredTensor:
    """A validated :class:`StoredTensor`: known dtype, non-negative ints, length = elements x
    item size."""
    if not isinstance(file, str) or dtype not in ITEM_SIZES:
        raise CorruptRecordError(what, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not (
        isinstance(shape, list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise CorruptRecordError(what, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    for value in (offset, nbytes):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CorruptRecordError(what, f"tensor {name!r}: bad offset or length {value!r}")
    if nbytes != math.prod(shape) * ITEM_SIZES[dtype]:
        raise CorruptRecordError(
            what, f"tensor {name!r}: {nbytes} bytes for {dtype} of shape {shape}"
        )
    return StoredTensor(file, dtype, tuple(shape), offset, nbytes)


def read_header(path: Path, relative: str) -> dict[str, StoredTensor]:
    """Every tensor of one safetensors file, from its header: ``8 + N`` bytes read.

    Raises:
        CorruptRecordError: The header is not safetensors' (length, JSON, dtypes, shapes), or a
            tensor's range lies outside the data or overlaps another's.
    """
    what = f"safetensors header of {relative}"
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise CorruptRecordError(what, "shorter than the 8-byte header length")
        length = int.from_bytes(prefix, "little")
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise CorruptRecordError(what, f"header length {length} exceeds the file")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise CorruptRecordError(what, f"header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise CorruptRecordError(what, "header is not a JSON object")
    data_start = 8 + length
    tensors: dict[str, StoredTensor] = {}
    for name, entry in header.items():
        if name == _METADATA_KEY:
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("data_offsets"), list):
            raise CorruptRecordError(what, f"tensor {name!r}: no data_offsets")
        offsets = entry["data_offsets"]
        if len(offsets) != 2 or not all(isinstance(o, int) for o in offsets):
            raise CorruptRecordError(what, f"tensor {name!r}: data_offsets {offsets!r}")
        start, end = offsets
        tensors[name] = _stored(
            what, name, relative, entry.get("dtype"), entry.get("shape"),
            data_start + start, end - start,
        )  # fmt: skip
    _check_ranges(what, tensors.values(), data_start, size)
    return tensors


def _check_ranges(what: str, tensors: Iterable[StoredTensor], start: int, size: int) -> None:
    """Every range inside ``[start, size)``, and no two overlapping."""
    previous_end = start
    for t in sorted(tensors, key=lambda t: (t.offset, t.end)):
        if t.offset < previous_end or t.end > size:
            raise CorruptRecordError(
                what, f"tensor range [{t.offset}, {t.end}) overlaps another or leaves the file"
            )
        previous_end = t.end


def checkpoint_files(folder: Path) -> list[str]:
    """The safetensors files of a checkpoint folder, relative to it, sorted.

    With a shard index (:data:`SHARD_INDEX_FILE`), the files its ``weight_map`` names (each
    must exist); otherwise every ``*.safetensors`` directly in the folder.

    Raises:
        CorruptRecordError: The shard index is malformed or names a missing file.
    """
    shard_index = folder / SHARD_INDEX_FILE
    if not shard_index.is_file():
        return sorted(p.name for p in folder.glob(f"*{SAFETENSORS_SUFFIX}") if p.is_file())
    what = f"{SHARD_INDEX_FILE} of {folder}"
    try:
        weight_map = json.loads(shard_index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptRecordError(what, f"no readable weight_map ({e!r})") from e
    if not isinstance(weight_map, dict):
        raise CorruptRecordError(what, "weight_map is not a mapping")
    files = sorted({str(f) for f in weight_map.values()})
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise CorruptRecordError(what, f"names missing files {missing}")
    return files


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def read_weight_index(
    folder: Path,
    digest: Callable[[Path], str] | None = None,
    files: Iterable[str] | None = None,
) -> WeightIndex:
    """The weight index of a checkpoint folder's safetensors files, from their headers.

    Args:
        folder: The checkpoint folder.
        files: The files to read, relative to ``folder``; None: :func:`checkpoint_files`.
        digest: Computes a file's sha256 (e.g. :func:`sha256_file`, or the build's stat-keyed
            fast path); None records ``""`` (no digest).

    Raises:
        CorruptRecordError: A header is malformed, a tensor is in two files, or the folder has
            no safetensors file.
    """
    names = sorted(files) if files is not None else checkpoint_files(folder)
    if not names:
        raise CorruptRecordError(str(folder), f"no {SAFETENSORS_SUFFIX} file")
    tensors: dict[str, StoredTensor] = {}
    for relative in names:
        for name, stored in read_header(folder / relative, relative).items():
            if name in tensors:
                raise CorruptRecordError(
                    str(folder), f"tensor {name!r} is in {tensors[name].file} and {relative}"
                )
            tensors[name] = stored
    return WeightIndex(tensors, {f: digest(folder / f) if digest else "" for f in names})
