"""Where a loaded model's weights are in the safetensors checkpoint it was loaded from: a
:data:`~hyperexport.library.export.weights.Locator` for the export's weight file.

A model loaded in the dtype its checkpoint stores holds each weight as a byte-exact copy of a
stored tensor. :class:`CheckpointLocator` maps the storage of each parameter and persistent
buffer (:func:`~hyperexport.library.export.weights.storage_key`) to its stored tensor, by name:
the first of the tensor's names that the checkpoint stores (a tied parameter has several and is
stored under one, as :class:`~hyperexport.library.capture.streaming.StreamedWeights` finds it),
as the model names it or with the model's ``base_model_prefix`` added or removed (transformers
loads a ``ForCausalLM`` checkpoint into its base model, ``model.layers.0...`` as ``layers.0...``).

Only the headers are read (:func:`~hyperexport.base.contracts.weight_index.read_weight_index`):
a tensor is placed when it is contiguous on the CPU and its dtype, shape and byte length are the
stored tensor's; that its values are the stored ones is trusted (the cache checks a declaration
byte for byte before it records it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from hyperexport.base.contracts.weight_index import StoredTensor, WeightIndex, read_weight_index
from hyperexport.library.capture.streaming import TORCH_DTYPES
from hyperexport.library.export.weights import StoredBytes, TensorKey, storage_key

log = logging.getLogger(__name__)


def stored_bytes(folder: Path, stored: StoredTensor) -> StoredBytes:
    """Where ``stored`` (of the checkpoint in ``folder``) is on disk, by absolute path."""
    return StoredBytes(str((folder / stored.file).resolve()), stored.offset, stored.nbytes)


def _names_in_checkpoint(name: str, prefix: str) -> Iterator[str]:
    """The names the checkpoint may store the model's ``name`` under."""
    yield name
    if prefix and name.startswith(f"{prefix}."):
        yield name.removeprefix(f"{prefix}.")
    elif prefix:
        yield f"{prefix}.{name}"


def _refusal(tensor: torch.Tensor, stored: StoredTensor) -> str | None:
    """Why ``tensor`` is not a copy of ``stored``'s bytes, or None when it may be."""
    if TORCH_DTYPES.get(stored.dtype) != tensor.dtype:
        return f"stored as {stored.dtype}, loaded as {tensor.dtype}"
    if (
        stored.shape != tuple(tensor.shape)
        or stored.nbytes != tensor.numel() * tensor.element_size()
    ):
        return f"stored with shape {list(stored.shape)}, loaded as {list(tensor.shape)}"
    if not tensor.is_contiguous():
        return "not contiguous"
    return None


class CheckpointLocator:
    """Places the weights of ``model`` in the safetensors files of ``folder`` (see the module).

    Call it with a tensor: where its bytes are stored, or None. It holds the model's tensors,
    so that a storage it placed is never freed and reused by another tensor.

    Args:
        model: The loaded model (its parameters on the meta device are skipped: a streamed
            model's weights are placed by name, ``streamed.py``).
        folder: The checkpoint folder the model was loaded from.
        index: The folder's weight index, if already read.

    Raises:
        CorruptRecordError: A header is malformed, or the folder has no safetensors file.

    Attributes:
        placed: Model name -> where its bytes are, for each tensor placed (one name per
            storage).
        refused: Model name -> why it was not placed, for each tensor the checkpoint stores
            under another dtype or shape (absent ones are neither).
        covers_all: Whether every tensor the model holds (off the meta device) was placed:
            its weight file is then the checkpoint's bytes and the padding.
    """

    def __init__(self, model: torch.nn.Module, folder: Path, index: WeightIndex | None = None):
        index = read_weight_index(folder) if index is None else index
        prefix = str(getattr(model, "base_model_prefix", "") or "")
        groups: dict[TensorKey, tuple[torch.Tensor, list[str]]] = {}
        for name, tensor in model.state_dict(keep_vars=True).items():
            if tensor.device.type == "cpu" and tensor.numel():
                groups.setdefault(storage_key(tensor), (tensor, []))[1].append(name)
        self._placed: dict[TensorKey, tuple[torch.Tensor, StoredBytes]] = {}
        self.placed: dict[str, StoredBytes] = {}
        self.refused: dict[str, str] = {}
        for key, (tensor, names) in groups.items():
            found = next(
                (s for n in names for s in _names_in_checkpoint(n, prefix) if s in index.tensors),
                None,
            )
            if found is None:
                continue
            refusal = _refusal(tensor, index.tensors[found])
            if refusal is not None:
                self.refused[names[0]] = refusal
                continue
            where = stored_bytes(folder, index.tensors[found])
            self._placed[key] = (tensor, where)
            self.placed[names[0]] = where
        self.covers_all = bool(groups) and len(self.placed) == len(groups)
        if not groups:  # a streamed model: its weights are placed by name (streamed.py)
            return
        log.info(
            "checkpoint sources: %d of %d weights (%.2f GiB) placed in %s%s",
            len(self.placed),
            len(groups),
            sum(w.nbytes for w in self.placed.values()) / 2**30,
            folder,
            f"; {len(self.refused)} not: {next(iter(self.refused.values()))}"
            if self.refused
            else "",
        )

    def __call__(self, tensor: torch.Tensor) -> StoredBytes | None:
        """Where ``tensor``'s bytes are stored, if it is one of the placed tensors (the same
        storage, offset, shape, strides and dtype)."""
        placed = self._placed.get(storage_key(tensor))
        return None if placed is None else placed[1]
