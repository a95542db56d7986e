"""Streamed weights: a model whose parameters come from a memory-mapped safetensors checkpoint,
one hiera module at a time (issue 36, ``docs/streaming.md``).

* :func:`parameters_on_meta`: modules built inside get their *parameters* on the meta device;
  buffers stay real (rotary frequencies are computed at construction and are in no checkpoint).
* :class:`MappedCheckpoint`: the checkpoint's files mapped privately, tensors as zero-copy views
  by state-dict name (:class:`~hyperexport.base.contracts.weight_index.WeightIndex`). Their pages are
  file-backed: counted in RSS while resident, never anonymous, and dropped by
  :meth:`MappedCheckpoint.release`.
* :class:`StreamedWeights`: binds the parameters outside every hiera instance for as long as it
  lives, and each hiera instance's own parameters only while that instance runs (forward hooks)
  or while :meth:`StreamedWeights.bound` is open (the export of its unit). A tensor stored in
  another dtype than the model's is a converted copy: the only anonymous weights.
* :func:`stand_in`: a zero-stride tensor of the right shape and dtype, two bytes, for exporters
  that must see a CPU tensor where no weight is bound; :func:`is_stand_in` recognises one.

A parameter left on the meta device that reaches a computation fails loudly (a device mismatch),
and one that reaches the capture fails in ``to_array``: an unbound weight never produces a value.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hyperexport.base.contracts.weight_index import WeightIndex
from hyperexport.base.errors import HyperExportError
from hyperexport.library import progress

log = logging.getLogger(__name__)

#: safetensors dtype names -> torch dtypes (the dtypes a streamed parameter can be stored in).
TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "F32": torch.float32,
    "I64": torch.int64,
    "F64": torch.float64,
}


class StreamingError(HyperExportError):
    """The checkpoint cannot stream into the model: names the tensor and why."""

    def __init__(self, tensor: str, reason: str) -> None:
        self.tensor = tensor
        self.reason = reason
        super().__init__(f"streamed weights: tensor {tensor!r}: {reason}")


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device; buffers stay real.

    (``torch.device("meta")`` would put buffers there too, and non-persistent ones are in no
    checkpoint.) ``nn.Module.register_parameter`` is patched for the duration, restored in
    ``finally``.
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            meta = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


class MappedCheckpoint:
    """A checkpoint folder's safetensors files, mapped on first use, tensors by name.

    The maps are private (copy-on-write; nothing writes them), so their pages are file-backed.
    """

    def __init__(self, folder: Path, index: WeightIndex) -> None:
        self.folder = folder
        self.index = index
        self._maps: dict[str, mmap.mmap] = {}

    def _map(self, file: str) -> mmap.mmap:
        if file not in self._maps:
            with open(self.folder / file, "rb") as f:
                self._maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[file]

    def view(self, name: str) -> torch.Tensor:
        """A zero-copy tensor over ``name``'s bytes in its mapped file."""
        stored = self.index.tensors[name]
        dtype = TORCH_DTYPES.get(stored.dtype)
        if dtype is None:
            raise StreamingError(name, f"stored as {stored.dtype}, which torch cannot view")
        if stored.nbytes == 0:
            return torch.empty(stored.shape, dtype=dtype)
        flat = torch.frombuffer(
            self._map(stored.file),
            dtype=dtype,
            count=stored.nbytes // dtype.itemsize,
            offset=stored.offset,
        )
        return flat.view(stored.shape)

    def release(self, name: str) -> None:
        """Drop ``name``'s pages from this process (read again from the file if touched)."""
        stored = self.index.tensors[name]
        if stored.nbytes == 0 or stored.file not in self._maps:
            return
        start = stored.offset // mmap.PAGESIZE * mmap.PAGESIZE
        self._maps[stored.file].madvise(mmap.MADV_DONTNEED, start, stored.end - start)

    def close(self) -> None:
        """Unmap every file (views over them must be gone)."""
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()


#: The checkpoint each streamed model's weights come from (set by the model's loader).
_CHECKPOINTS: weakref.WeakKeyDictionary[torch.nn.Module, MappedCheckpoint] = (
    weakref.WeakKeyDictionary()
)


def attach_checkpoint(model: torch.nn.Module, checkpoint: MappedCheckpoint) -> None:
    """Record that ``model``'s parameters are on the meta device and stream from
    ``checkpoint`` (the loader of a streamed model calls this)."""
    _CHECKPOINTS[model] = checkpoint


def streamed_checkpoint(model: torch.nn.Module) -> MappedCheckpoint | None:
    """The checkpoint ``model`` streams from, or None for a loaded model."""
    return _CHECKPOINTS.get(model)


def stand_in(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``shape`` and ``dtype`` that holds one zero (every stride 0)."""
    return torch.zeros((), dtype=dtype).expand(*shape)


def is_stand_in(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a :func:`stand_in` (one stored element, every stride 0)."""
    return (
        tensor.dim() > 0
        and all(s == 0 for s in tensor.stride())
        and tensor.untyped_storage().nbytes() == tensor.element_size()
        and tensor.numel() > 1
    )


def _set_parameter(model: torch.nn.Module, name: str, value: torch.nn.Parameter) -> None:
    owner_path, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    owner._parameters[attr] = value


class StreamedWeights:
    """Binds a meta-parameter model's weights to a mapped checkpoint, hiera instances only
    while they run.

    Construction checks that every parameter has a stored tensor of its shape (a tied
    parameter may be stored under any of its names) and that every stored tensor is a
    parameter or a persistent buffer of the model; stored buffers are copied into the model's
    (they are small, and from_pretrained loads them too).

    Args:
        model: A model built under :func:`parameters_on_meta`.
        checkpoint: The mapped checkpoint.
        hiera: The classes whose instances stream; other parameters are bound for the object's
            life (:meth:`bind_outside`).

    Raises:
        StreamingError: A parameter the checkpoint lacks, a shape that differs, or a stored
            tensor the model does not name.
    """

    def __init__(
        self, model: torch.nn.Module, checkpoint: MappedCheckpoint, hiera: tuple[type, ...]
    ) -> None:
        self.model = model
        self.checkpoint = checkpoint
        self.instances: dict[str, torch.nn.Module] = {}
        for path, module in model.named_modules():
            if path and isinstance(module, hiera):
                self.instances[path] = model.get_submodule(path)
        # Every name of each parameter object (tied parameters have several), and its meta form.
        self._names: dict[int, list[str]] = {}
        self._meta: dict[int, torch.nn.Parameter] = {}
        self._key: dict[str, int] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(p), []).append(name)
            self._meta[id(p)] = p
            self._key[name] = id(p)
        self._stored: dict[int, str] = {
            key: self._find(names) for key, names in self._names.items()
        }
        self._check_unnamed()
        self._own: dict[str, list[int]] = {path: [] for path in self.instances}
        self._outside: list[int] = []
        for key, names in self._names.items():
            owner = self._owner(names[0])
            (self._own[owner] if owner else self._outside).append(key)
        self._depth: dict[str, int] = {}
        self.bound_bytes = 0  # stored bytes of hiera parameters bound at this moment
        self.bound_peak = 0
        self.calls = 0
        self.entered: set[str] = set()  # the instances bound at least once
        #: Called with ``len(entered)`` when an instance is bound for the first time.
        self.on_first_entry: Callable[[int], None] | None = None

    def _find(self, names: list[str]) -> str:
        stored = next((n for n in names if n in self.checkpoint.index.tensors), None)
        if stored is None:
            raise StreamingError(names[0], "the model has it, the checkpoint does not")
        shape = tuple(self._meta[self._key[names[0]]].shape)
        if self.checkpoint.index.tensors[stored].shape != shape:
            found = self.checkpoint.index.tensors[stored].shape
            raise StreamingError(
                stored, f"stored with shape {list(found)}, model has {list(shape)}"
            )
        return stored

    def _check_unnamed(self) -> None:
        """Copy stored persistent buffers in; refuse a stored tensor the model does not name."""
        named = {n for names in self._names.values() for n in names}
        buffers = dict(self.model.named_buffers())
        state = set(self.model.state_dict(keep_vars=True))
        for name in self.checkpoint.index.tensors:
            if name in named:
                continue
            if name in buffers and name in state:
                with torch.no_grad():
                    buffers[name].copy_(self.checkpoint.view(name))
                continue
            raise StreamingError(name, "in the checkpoint, but the model has no such weight")

    def _owner(self, name: str) -> str:
        """The innermost hiera instance holding ``name``, or ``""`` outside every one."""
        best = ""
        for path in self.instances:
            if name.startswith(f"{path}.") and len(path) > len(best):
                best = path
        return best

    def _bind(self, key: int) -> int:
        meta = self._meta[key]
        stored = self._stored[key]
        tensor = self.checkpoint.view(stored)
        if tensor.dtype != meta.dtype:
            tensor = tensor.to(meta.dtype)
        bound = torch.nn.Parameter(tensor, requires_grad=False)
        for name in self._names[key]:
            _set_parameter(self.model, name, bound)
        return self.checkpoint.index.tensors[stored].nbytes

    def _unbind(self, key: int) -> int:
        for name in self._names[key]:
            _set_parameter(self.model, name, self._meta[key])
        self.checkpoint.release(self._stored[key])
        return self.checkpoint.index.tensors[self._stored[key]].nbytes

    def bind_outside(self) -> int:
        """Bind every parameter outside the hiera instances (until :meth:`release_outside`);
        their stored bytes."""
        return sum(self._bind(key) for key in self._outside)

    def release_outside(self) -> None:
        """Put the meta parameters back outside the hiera instances and drop their pages."""
        for key in self._outside:
            self._unbind(key)

    def enter(self, path: str) -> None:
        """Bind ``path``'s own parameters (not a nested instance's); re-entrant."""
        if self._depth.get(path, 0):
            self._depth[path] += 1
            return
        self._depth[path] = 1
        self.bound_bytes += sum(self._bind(key) for key in self._own[path])
        self.bound_peak = max(self.bound_peak, self.bound_bytes)
        self.calls += 1
        if path not in self.entered:
            self.entered.add(path)
            if self.on_first_entry is not None:
                self.on_first_entry(len(self.entered))

    def exit(self, path: str) -> None:
        """Undo one :meth:`enter`; the last puts the meta parameters back and drops the pages."""
        self._depth[path] -= 1
        if self._depth[path]:
            return
        del self._depth[path]
        self.bound_bytes -= sum(self._unbind(key) for key in self._own[path])

    @contextlib.contextmanager
    def bound(self, path: str) -> Iterator[torch.nn.Module]:
        """``path``'s own parameters bound for the duration; yields the instance."""
        self.enter(path)
        try:
            yield self.instances[path]
        finally:
            self.exit(path)

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """Forward hooks that bind each hiera instance around its calls. Register them before
        the capture's own hooks. On exit every instance still bound (a call that raised) is
        released."""
        handles = []
        try:
            for path, module in self.instances.items():
                handles.append(module.register_forward_pre_hook(self._pre_hook(path)))
                handles.append(module.register_forward_hook(self._post_hook(path)))
            yield
        finally:
            for handle in handles:
                handle.remove()
            for path in list(self._depth):
                self._depth[path] = 1
                self.exit(path)

    def _pre_hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.enter(path)

        return hook

    def _post_hook(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.exit(path)

        return hook

    def stored_name(self, parameter: str) -> str:
        """The checkpoint's name of a model parameter (a tied one may be stored under another)."""
        return self._stored[self._key[parameter]]

    def is_parameter(self, name: str) -> bool:
        """Whether ``name`` is one of the model's parameters (under any of its names)."""
        return name in self._key

    def tensor(self, parameter: str) -> torch.Tensor:
        """``parameter``'s value as it is bound: a view of the mapped bytes, or a converted copy
        where the model's dtype is not the stored one."""
        meta = self._meta[self._key[parameter]]
        tensor = self.checkpoint.view(self.stored_name(parameter))
        return tensor if tensor.dtype == meta.dtype else tensor.to(meta.dtype)

    def parameter_dtype(self, parameter: str) -> torch.dtype:
        """The model's dtype of ``parameter`` (its meta form's)."""
        return self._meta[self._key[parameter]].dtype

    @contextlib.contextmanager
    def bound_with_stand_ins(self, paths: Sequence[str]) -> Iterator[None]:
        """The instances at ``paths`` bound (``""``, the root, binds nothing of its own) and the
        own parameters of every other hiera instance replaced by :func:`stand_in` tensors, for
        the duration: what an exporter that traces every unit in one program sees (the dynamo
        path). Only the units' representative instances hold weights; a stand-in has the shape
        and dtype of its parameter and two bytes of storage, and the export resolves every
        weight by name, never from it. The meta parameters are put back on exit."""
        stood: list[int] = []
        with contextlib.ExitStack() as bound:
            for path in dict.fromkeys(p for p in paths if p):
                bound.enter_context(self.bound(path))
            try:
                for path, keys in self._own.items():
                    if self._depth.get(path):
                        continue
                    for key in keys:
                        meta = self._meta[key]
                        standing = torch.nn.Parameter(
                            stand_in(meta.shape, meta.dtype), requires_grad=False
                        )
                        for name in self._names[key]:
                            _set_parameter(self.model, name, standing)
                        stood.append(key)
                yield
            finally:
                for key in stood:
                    for name in self._names[key]:
                        _set_parameter(self.model, name, self._meta[key])

    @contextlib.contextmanager
    def bound_unit(self, path: str) -> Iterator[None]:
        """:meth:`bound` for a hiera instance's path; nothing for the root (``""``)."""
        if not path:
            yield
            return
        with self.bound(path):
            yield


@contextlib.contextmanager
def streamed_run(model: torch.nn.Module, hiera: Sequence[type]) -> Iterator[StreamedWeights | None]:
    """Run ``model`` with its weights streamed, if it streams: outside the hiera instances
    bound for the duration, each instance bound around its calls (enter this before the
    capture's hooks are registered). Yields None, and does nothing, for a loaded model.
    """
    checkpoint = streamed_checkpoint(model)
    if checkpoint is None:
        yield None
        return
    weights = StreamedWeights(model, checkpoint, tuple(hiera))
    outside = weights.bind_outside()
    log.info(
        "streaming %d hiera instances; %.2f GiB outside them bound (mapped)",
        len(weights.instances),
        outside / 2**30,
    )
    try:
        with (
            progress.counting(
                "running hiera instances",
                unit="instances",
                total=len(weights.instances),
                memory=True,
            ) as update,
            weights.hooks(),
        ):
            weights.on_first_entry = update
            yield weights
    finally:
        weights.on_first_entry = None
        weights.release_outside()
    log.info(
        "streamed %d hiera calls, at most %.2f GiB of their weights bound at once",
        weights.calls,
        weights.bound_peak / 2**30,
    )
