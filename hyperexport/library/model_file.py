"""Write the final model (and its external data) atomically; its tensors once. No torch here.

The composed model's weights are references into the export's ``units/weights.data`` (see
``weights.py``), in initializers and, per instance, in the ``Constant`` nodes of function bodies.
Saving with external data therefore does not rewrite the weights: the data file is a clone of
that file (a reflink where the filesystem has them, else one sequential copy in the kernel),
every reference keeps its offset, and only tensors that passes made in memory (folded
constants) at or above the threshold are appended. No weight passes through this process's
memory, and the protobuf holds only references, so no size limit applies.

Without external data every tensor is read into the protobuf, which cannot exceed 2 GiB: such a
model is refused before anything is written.

Every model file hyperexport writes (the rewrite's, the quantize stage's, ``export_hyper_onnx``'s)
is written here, at the lowest IR version that carries its opsets and local functions
(:func:`stamped_proto`, ``versions.lowest_ir_version``), whatever IR version the exporter
gave it: older runtimes load what they can run. Nothing else in the file changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import onnx_ir as ir

from hyperexport.base.errors import ResourceError
from hyperexport.base.versions import lowest_ir_version
from hyperexport.engine.files import clone_or_copy
from hyperexport.library.tensor_bytes import write_tensor
from hyperexport.library.tensor_slots import TensorSlot, tensor_slots

log = logging.getLogger(__name__)

#: Saving clones the export's weight file and appends what the passes made, unless the model
#: reads less than this share of that file: then the clone would mostly carry tensors the
#: passes replaced (packed projections: half the weights at 1B), and a fresh file holding only
#: what the model reads is written instead, tensor by tensor.
CLONE_MIN_LIVE = 0.9

#: The protobuf limit of a model without external data, with room for the graph itself.
PROTOBUF_LIMIT = 2**31 - (64 << 20)


def _external_path(tensor: ir.TensorProtocol) -> str | None:
    if isinstance(tensor, ir.ExternalTensor):
        return os.path.realpath(tensor.path)
    return None


def _base_file(slots: list[TensorSlot]) -> str | None:
    """The external data file that holds the most referenced bytes (the one to clone)."""
    sizes: dict[str, int] = {}
    for slot in slots:
        source = _external_path(slot.tensor)
        if source is not None:
            sizes[source] = sizes.get(source, 0) + slot.tensor.nbytes
    return max(sizes, key=lambda k: sizes[k]) if sizes else None


def _swapped(
    slots: list[TensorSlot], tensors: list[ir.TensorProtocol], write: Callable[[], None]
) -> None:
    """Put ``tensors`` into the slots, call ``write``, and put the originals back."""
    try:
        for slot, tensor in zip(slots, tensors, strict=True):
            slot.put(tensor)
        write()
    finally:
        for slot in slots:
            slot.put(slot.tensor)


def load_model(path: Path) -> ir.Model:
    """``ir.load`` of ``path``, with every external tensor able to find its data file.

    ``ir.load`` resolves external data relative to the model's folder for the tensors of the
    main graph and its subgraphs, but not for those in function bodies (``Constant`` values of
    per_instance functions), which it leaves relative to the working directory: such a model
    fails when its weights are read (seen with onnx_ir 1.1.0, in the quantize stage of a
    ``per_instance`` recipe with ``external_data: true``). Every tensor slot is given the
    model's folder here.
    """
    model = ir.load(path)
    folder = os.fspath(Path(path).parent)
    for slot in tensor_slots(model):
        tensor = slot.tensor
        if isinstance(tensor, ir.ExternalTensor) and not os.path.isabs(tensor.path):
            tensor.base_dir = folder
    return model


def ir_version_to_write(model: ir.Model) -> int:
    """The lowest IR version that carries ``model``'s opset imports, its functions' and the
    functions themselves."""
    opsets = dict(model.opset_imports)
    for function in model.functions.values():
        for domain, version in function.opset_imports.items():
            opsets[domain] = max(version, opsets.get(domain, version))
    return lowest_ir_version(opsets, functions=bool(model.functions))


def stamped_proto(model: ir.Model) -> Any:
    """``model`` as an ``onnx.ModelProto`` at :func:`ir_version_to_write` (``model`` unchanged)."""
    proto = ir.to_proto(model)
    proto.ir_version = ir_version_to_write(model)
    return proto


def _write_proto(model: ir.Model, path: Path) -> None:
    path.write_bytes(stamped_proto(model).SerializeToString())


@dataclass(frozen=True)
class DataFileOrigin:
    """How a saved data file began: the bytes of ``cloned`` (``cloned_bytes``, its whole size;
    a clone, or the file itself taken over), with the tensors the passes made appended after;
    what a stage may declare to its cache (``engine/sourced.py``) so that the file is recorded
    as its input's bytes plus the tail."""

    path: Path
    cloned: str
    cloned_bytes: int


def save_external(
    model: ir.Model,
    path: Path,
    threshold: int,
    *,
    consume: bool = False,
    link_unchanged: bool = False,
    fresh: bool = False,
    take: Callable[[Path], bool] | None = None,
) -> DataFileOrigin | None:
    """Write ``model`` to ``path`` with its tensors in ``<name>.data`` beside it (atomically).

    Tensors already in an external data file keep their bytes: the largest such file is cloned
    as the new data file (with ``consume``, moved: for a caller whose bundle is temporary and on
    the same filesystem, so the weights are written once in all), unless the model reads less
    than :data:`CLONE_MIN_LIVE` of it: then every tensor is written into a fresh file. Tensors
    in memory of at least ``threshold`` bytes are appended; smaller ones stay in the protobuf.
    The data file is moved into place first and the model last, so a reader never sees a model
    without its data. ``model`` is left unchanged (after ``consume`` its references point at the moved file).

    With ``link_unchanged`` and nothing to append, the data file is a symlink to that file (its
    real path) instead of a clone: for the build's rewrite stage, whose store records such a
    link under the digest of the checked-out file it names, copying nothing
    (``engine/workspace.py``). Not for a model handed to a user: onnx, onnx_ir and ONNX Runtime
    refuse external data through a symlink that leaves the model's folder. When tensors must be
    appended the file is cloned first (on a filesystem without reflinks, a full copy: logged at
    INFO with its size).

    With ``fresh`` the data file is always a fresh one of only what the model reads (the
    quantize stage's model, whose float weights are gone).

    ``take`` is asked, before a file is cloned to be appended to, whether that file may be
    moved instead (the build's rewrite stage: ``StageInputs.take``, true for the build's one
    copy of the export's weights when no later stage reads them); the file is then moved and
    appended to, and the origin still names it.

    Returns:
        The data file's origin when it holds an existing file's bytes (cloned, appended to or
        not, or taken over); None when it is new, moved by ``consume`` or linked.
    """
    path = Path(path)
    data_name = f"{path.name}.data"
    slots = tensor_slots(model)
    base = None if fresh else _base_file(slots)
    if base is not None:
        live, size = _live_bytes(slots, base), os.path.getsize(base)
        if live < CLONE_MIN_LIVE * size:  # mostly tensors the passes replaced: write afresh
            log.info(
                "after the passes the model reads %.0f%% of the export's weight file (%.2f GB): "
                "writing a data file of only what it reads",
                100 * live / size,
                size / 1e9,
            )
            base = None
    to_append, append_bytes = _appends(slots, base, threshold)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        staged, staged_data = Path(tmp) / path.name, Path(tmp) / data_name
        cloned = False  # staged_data a clone of base (neither new, linked nor moved)
        if base is None:
            how = "new"
        elif link_unchanged and not to_append:
            os.symlink(base, staged_data)
            how = "linked"
        else:
            taken = bool(to_append) and take is not None and take(Path(base))
            origin = (os.path.realpath(base), os.path.getsize(base))
            how = _take(Path(base), staged_data, consume or taken)
            moved = not os.path.exists(base)
            # A clone, or a file taken over: its bytes begin the new file. A consumed bundle's
            # file is gone with its bundle.
            cloned = not moved or taken
            if taken and moved:
                log.info(
                    "took over the export's weight file (%.2f GB) to append %d tensors (%d "
                    "bytes) that passes made: no later stage reads it",
                    origin[1] / 1e9,
                    to_append,
                    append_bytes,
                )
            if to_append and how == "copy":
                log.info(
                    "copied the export's weight file (%.2f GB) to append %d tensors (%d bytes) "
                    "that passes made",
                    os.path.getsize(base) / 1e9,
                    to_append,
                    append_bytes,
                )
        appended: dict[int, tuple[int, int]] = {}
        replacements: list[ir.TensorProtocol] = []
        with contextlib.ExitStack() as stack:
            data = None if how == "linked" else stack.enter_context(_appending(staged_data))
            for slot in slots:
                tensor = slot.tensor
                source = _external_path(tensor)
                if source is not None and source == base:
                    offset, length = tensor.offset, tensor.length  # type: ignore[attr-defined]
                elif _goes_external(tensor, threshold):
                    assert data is not None, "a linked data file is never appended to"
                    if id(tensor) not in appended:
                        appended[id(tensor)] = _append(data, tensor)
                    offset, length = appended[id(tensor)]
                else:
                    replacements.append(_inline(tensor) if source is not None else tensor)
                    continue
                replacements.append(
                    ir.ExternalTensor(
                        data_name,
                        offset,
                        length,
                        tensor.dtype,
                        shape=ir.Shape(tensor.shape.numpy()),
                        name=tensor.name or "",
                        base_dir=os.fspath(path.parent),
                    )
                )
        _swapped(slots, replacements, lambda: _write_proto(model, staged))
        if staged_data.is_symlink() or staged_data.stat().st_size:  # else: no data file
            os.replace(staged_data, path.parent / data_name)
        os.replace(staged, path)
    log.info(
        "saved %s with external data %s (the export's weight file: %s; %d tensors appended)",
        path.name,
        data_name,
        how,
        len(appended),
    )
    if base is None or not cloned:
        return None
    return DataFileOrigin(path.parent / data_name, *origin)


def _live_bytes(slots: list[TensorSlot], base: str) -> int:
    """Bytes of ``base`` that some tensor of the model still reads (each range once)."""
    ranges = {
        (slot.tensor.offset, slot.tensor.length)  # type: ignore[attr-defined]
        for slot in slots
        if _external_path(slot.tensor) == base
    }
    return sum(length or 0 for _, length in ranges)


#: A tensor's ``meta`` key: saved in the model file whatever its size (:func:`keep_in_model_file`).
IN_MODEL_FILE = "hyperexport.in_model_file"


def keep_in_model_file(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    """Mark ``tensor`` (a pass's constant, made in memory) to be saved in the model file, not
    appended to the data file: a data file nothing is appended to stays the export's, linked
    (``link_unchanged``), where appending tens of MB costs reading and hashing all the weights
    again (20 s at the 1B shape). Returns ``tensor``."""
    tensor.meta[IN_MODEL_FILE] = True
    return tensor


def _goes_external(tensor: ir.TensorProtocol, threshold: int) -> bool:
    return tensor.nbytes >= threshold and not tensor.meta.get(IN_MODEL_FILE, False)


def _appends(slots: list[TensorSlot], base: str | None, threshold: int) -> tuple[int, int]:
    """``(tensors, bytes)`` that saving appends to the data file: those at or over
    ``threshold`` that are not already in ``base`` (and not kept in the model file), each
    counted once."""
    seen: dict[int, int] = {}
    for slot in slots:
        source = _external_path(slot.tensor)
        if (source is None or source != base) and _goes_external(slot.tensor, threshold):
            seen[id(slot.tensor)] = slot.tensor.nbytes
    return len(seen), sum(seen.values())


def _take(base: Path, staged: Path, consume: bool) -> str:
    """Make ``staged`` hold ``base``'s bytes: moved when ``consume`` allows, else cloned."""
    if consume:
        try:
            os.replace(base, staged)
            return "moved"
        except OSError as e:  # another filesystem: clone instead
            log.debug("cannot move %s (%s); cloning", base, e)
    return clone_or_copy(base, staged)


def _appending(path: Path) -> BinaryIO:
    """``path`` open for writing at its end, without ``O_APPEND`` (which the kernel copies of
    :func:`~hyperexport.library.tensor_bytes.write_tensor` refuse)."""
    out = open(path, "r+b" if path.exists() else "wb")  # noqa: SIM115 (the caller closes it)
    out.seek(0, os.SEEK_END)
    return out


def _append(out: BinaryIO, tensor: ir.TensorProtocol) -> tuple[int, int]:
    """Append one tensor's bytes (64-byte aligned); return its offset and length."""
    offset = out.tell()
    pad = -offset % 64
    if pad:
        out.write(b"\0" * pad)
        offset += pad
    return offset, write_tensor(out, tensor)


def _inline(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    """An external tensor read into memory (small ones only, or a model without external data)."""
    array = tensor.numpy()
    return ir.Tensor(np.array(array), dtype=tensor.dtype, name=tensor.name)


def save_inline(model: ir.Model, path: Path) -> None:
    """Write ``model`` to ``path`` as one protobuf, every tensor inside it (atomically).

    Raises:
        ResourceError: The tensors exceed the 2 GiB protobuf limit (before anything is
            written); names ``external_data``, the option that lifts it.
    """
    data = serialize_inline(model)
    with tempfile.TemporaryDirectory(dir=Path(path).parent, prefix=f".{Path(path).name}.") as tmp:
        staged = Path(tmp) / Path(path).name
        staged.write_bytes(data)
        os.replace(staged, path)


def serialize_inline(model: ir.Model) -> bytes:
    """``model`` as one protobuf with every tensor inside it (external ones read in).

    Raises:
        ResourceError: The tensors exceed the 2 GiB protobuf limit.
    """
    slots = tensor_slots(model)
    total = sum(slot.tensor.nbytes for slot in {id(s.tensor): s for s in slots}.values())
    check_inline_size(total)
    replacements = [_inline(s.tensor) if _external_path(s.tensor) else s.tensor for s in slots]
    result: list[bytes] = []
    _swapped(slots, replacements, lambda: result.append(stamped_proto(model).SerializeToString()))
    return result[0]


def check_inline_size(weight_bytes: int) -> None:
    """Refuse a model without external data whose tensors exceed the protobuf limit.

    Raises:
        ResourceError: Names the size and ``external_data``.
    """
    if weight_bytes > PROTOBUF_LIMIT:
        raise ResourceError(
            f"the model's tensors take {weight_bytes / 2**30:.2f} GiB, over the 2 GiB limit of a "
            "single ONNX protobuf; set external_data=True (recipe: external_data: true) to store "
            "them in <model>.onnx.data"
        )


def save_model(
    model: ir.Model,
    path: Path,
    *,
    external_data: bool,
    threshold: int = 1024,
    consume_bundle: bool = False,
    link_unchanged: bool = False,
    take: Callable[[Path], bool] | None = None,
) -> DataFileOrigin | None:
    """Write ``model`` to ``path`` atomically; the data file's origin (:func:`save_external`)
    when it is a clone.

    With ``external_data``, every tensor of at least ``threshold`` bytes lives in
    ``<name>.data`` beside the model: initializers, and also the Constant tensors inside
    functions (per-instance weights). Weights the export already wrote (``units/weights.data``)
    are not rewritten: that file is cloned (reflink, else a kernel copy) and the references keep
    their offsets. The data file is moved into place first and the model last, so a reader never
    sees a model without its data. ``consume_bundle`` moves that file instead (the bundle is
    temporary and is discarded after the save); ``link_unchanged`` makes it a symlink to that
    file when nothing is appended (the build's rewrite stage: see :func:`save_external`), and
    ``take`` lets it move that file to append to it rather than clone it.
    Nothing depends on the working directory, and
    an earlier export's files at ``path`` are replaced.

    Raises:
        ResourceError: Without ``external_data``, the tensors exceed the 2 GiB protobuf limit
            (checked before anything is written).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data:
        return save_external(
            model,
            path,
            threshold,
            consume=consume_bundle,
            link_unchanged=link_unchanged,
            take=take,
        )
    save_inline(model, path)
    return None


def save_compact(model: ir.Model, path: Path, *, external_data: bool, threshold: int) -> None:
    """Write ``model`` with a fresh data file holding only the tensors it still uses (the
    quantize stage's model, whose float weights are gone), atomically: data, then model. Its
    IR version is set to :func:`ir_version_to_write` first (``model`` keeps it).

    With external data every tensor slot is written by :func:`save_external` (``fresh``):
    ``ir.save`` moves only initializers into its data file and left a ``Constant`` value that
    was external data pointing into the float model's file, which the quantized model's folder
    does not have. Without it, one protobuf (:func:`save_inline`, the 2 GiB limit checked
    first).
    """
    path = Path(path)
    model.ir_version = ir_version_to_write(model)
    if external_data:
        save_external(model, path, threshold, fresh=True)
    else:
        save_inline(model, path)
