"""Prototype of issue 36's streaming trace: capture a checkpoint's model one layer at a time.

    python bench/stream_trace_proto.py CKPT OUT --mode stream [--dynamo] [--seq 32]
    python bench/stream_trace_proto.py CKPT OUT --mode eager  [--dynamo] [--seq 32]
    python bench/stream_trace_proto.py CKPT OUT --compare
    python bench/stream_trace_proto.py CKPT OUT --mode export [--dtype float32]
    python bench/stream_trace_proto.py CKPT OUT --all      # eager, stream, compare; each in
                                                            # its own process under memwatch

``--mode stream`` builds ``AutoModelForCausalLM`` from the checkpoint's ``config.json`` with every
*parameter* on the meta device (buffers real: the rotary frequencies are computed at
construction and are in no checkpoint). Parameters outside the hiera modules (embedding, final
norm, lm_head) are then bound to zero-copy views of the memory-mapped safetensors files: their
pages are file-backed, never anonymous. Each hiera module (``LlamaDecoderLayer``) gets a forward
pre-hook that binds its parameters to views of the mapped files just before its call, and a
forward hook that puts the meta parameters back and tells the kernel to drop the pages
(``madvise(MADV_DONTNEED)``). Then hyperexport's own ``capture_model`` runs, unchanged, on
that model (under ``torch.jit.trace`` for the TorchScript path, as the trace stage does).

``--mode eager`` captures the same inputs from ``from_pretrained`` (the trace stage today).
``--compare`` asserts that both captures hold the same record and bitwise-equal arrays.
``--mode export`` goes on after the streamed capture (TorchScript path, per_type): each layer's
unit is exported with that layer bound, the root with the layers' parameters left on the meta
device and its initializers then read from the checkpoint by name (a patch of the TorchScript
path, for the prototype only), then today's composition, save and ``run_checks``; it prints the
peaks of each phase and the check's first lines. ``--dtype float32`` loads a bf16 checkpoint
converted (every bound tensor a converted copy).
Each mode prints its wall time, peak RSS and peak anonymous memory (``RssAnon + VmSwap`` of this
process, sampled every 0.1 s by ``bench/memwatch.py``'s sampler).

This is a prototype: the design and what the implementation must change are in
``docs/streaming.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from memwatch import Sampler

HIERA = "transformers.models.llama.modeling_llama.LlamaDecoderLayer"

#: safetensors dtype names -> torch dtypes.
_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I64": torch.int64,
}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are in a safetensors file."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the start of the file: 8 + header length + data_offsets[0]
    nbytes: int


def read_header(file: Path) -> dict[str, StoredTensor]:
    """Every tensor of a safetensors file, from its header only (8 + N bytes read)."""
    with open(file, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        tensors[name] = StoredTensor(
            file, entry["dtype"], tuple(entry["shape"]), 8 + length + start, end - start
        )
    return tensors


class MappedCheckpoint:
    """A checkpoint folder's safetensors files, memory-mapped, tensors by state-dict name.

    The maps are private (copy-on-write, never written): their pages are file-backed, counted in
    RSS while resident but not as anonymous memory, and dropped by :meth:`release`.
    """

    def __init__(self, folder: Path) -> None:
        self.tensors: dict[str, StoredTensor] = {}
        for file in sorted(folder.glob("*.safetensors")):
            self.tensors.update(read_header(file))
        self._maps: dict[Path, mmap.mmap] = {}

    def _map(self, file: Path) -> mmap.mmap:
        if file not in self._maps:
            with open(file, "rb") as f:
                self._maps[file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[file]

    def view(self, name: str) -> torch.Tensor:
        """A zero-copy tensor over ``name``'s bytes in the mapped file."""
        stored = self.tensors[name]
        dtype = _DTYPES[stored.dtype]
        count = stored.nbytes // dtype.itemsize
        flat = torch.frombuffer(
            self._map(stored.file), dtype=dtype, count=count, offset=stored.offset
        )
        return flat.view(stored.shape)

    def release(self, name: str) -> None:
        """Drop ``name``'s pages from this process (they are read again if touched again)."""
        stored = self.tensors[name]
        page = mmap.PAGESIZE
        start = stored.offset // page * page
        self._map(stored.file).madvise(
            mmap.MADV_DONTNEED, start, stored.offset + stored.nbytes - start
        )


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device; buffers stay real.

    (``torch.device("meta")`` would put buffers there too, and non-persistent ones, such as
    rotary frequencies, are in no checkpoint.) ``register_parameter`` is patched for the
    duration and restored in ``finally``.
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: Any) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            meta = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def _bind(module: torch.nn.Module, local: str, tensor: torch.Tensor) -> None:
    owner_path, _, attr = local.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    owner._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)


class StreamedWeights:
    """Binds parameters to the mapped checkpoint: hiera modules only while they run.

    Args:
        model: A model whose parameters are on the meta device.
        checkpoint: The mapped checkpoint.
        hiera: The classes whose instances stream.
    """

    def __init__(
        self, model: torch.nn.Module, checkpoint: MappedCheckpoint, hiera: tuple[type, ...]
    ) -> None:
        self.model = model
        self.checkpoint = checkpoint
        self.streamed = {
            path: m for path, m in model.named_modules() if isinstance(m, hiera) and m is not model
        }
        self._saved: dict[str, dict[str, torch.nn.Parameter]] = {}  # bound path -> meta params
        self._depth: dict[str, int] = {}
        self.bound_now = 0  # bytes of hiera parameters bound at this moment
        self.bound_peak = 0
        self.calls = 0

    def _stored_name(self, name: str) -> str:
        if name in self.checkpoint.tensors:
            return name
        # A tied parameter (lm_head.weight = embed_tokens.weight) is stored once.
        shared = self._aliases.get(name, ())
        found = next((n for n in shared if n in self.checkpoint.tensors), None)
        if found is None:
            raise KeyError(f"parameter {name!r} is not in the checkpoint")
        return found

    def bind_outside(self) -> int:
        """Bind every parameter outside the hiera modules to its mapped bytes; their count."""
        by_id: dict[int, list[str]] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            by_id.setdefault(id(p), []).append(name)
        self._aliases = {n: names for names in by_id.values() for n in names}
        prefixes = tuple(f"{p}." for p in self.streamed)
        bound = 0
        for name, p in list(self.model.named_parameters(remove_duplicate=False)):
            if not name.startswith(prefixes):
                _bind(self.model, name, self._tensor(self._stored_name(name), p.dtype))
                bound += 1
        return bound

    @contextlib.contextmanager
    def bound(self, path: str) -> Iterator[None]:
        """``path``'s parameters bound for the duration (the export of its unit)."""
        module = self.streamed[path]
        self._pre(path)(module, ())
        try:
            yield
        finally:
            self._post(path)(module, (), None)

    def _pre(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            if path in self._saved:  # bound already (its unit's export runs its forward)
                self._depth[path] += 1
                return
            self._saved[path] = dict(module.named_parameters())
            self._depth[path] = 1
            for local, p in self._saved[path].items():
                stored = self._stored_name(f"{path}.{local}")
                _bind(module, local, self._tensor(stored, p.dtype))
                # (Not tensor.numel(): under torch.jit.trace sizes are traced tensors.)
                self.bound_now += self.checkpoint.tensors[stored].nbytes
            self.bound_peak = max(self.bound_peak, self.bound_now)
            self.calls += 1

        return hook

    def _post(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self._depth[path] -= 1
            if self._depth[path]:
                return
            for local, meta in self._saved.pop(path).items():
                _bind(module, local, meta.data)
                stored = self._stored_name(f"{path}.{local}")
                self.checkpoint.release(stored)
                self.bound_now -= self.checkpoint.tensors[stored].nbytes

        return hook

    def _tensor(self, stored: str, dtype: torch.dtype) -> torch.Tensor:
        """The mapped tensor; in another dtype than stored, a converted copy (anonymous)."""
        tensor = self.checkpoint.view(stored)
        return tensor if tensor.dtype == dtype else tensor.to(dtype)

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        handles = []
        try:
            for path, module in self.streamed.items():
                handles.append(module.register_forward_pre_hook(self._pre(path)))
                handles.append(module.register_forward_hook(self._post(path)))
            yield
        finally:
            for h in handles:
                h.remove()


def _inputs(config: Mapping[str, Any], seq: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, int(config["vocab_size"]), (1, seq), generator=generator)


def capture(ckpt: Path, out: Path, mode: str, dynamo: bool, seq: int) -> dict[str, Any]:
    import transformers

    from hyperexport.library.api import capture_model

    config = json.loads((ckpt / "config.json").read_text())
    ids = _inputs(config, seq)
    started = time.perf_counter()
    extra: dict[str, Any] = {}
    if mode == "eager":
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
        model.config.use_cache = False
        loaded = time.perf_counter()
        result = capture_model(model.eval(), (ids,), hiera=[HIERA], dynamo=dynamo)
    else:
        auto = transformers.AutoConfig.from_pretrained(ckpt)
        auto.use_cache = False
        with parameters_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(auto, dtype=torch.bfloat16)
        layer = type(model.model.layers[0])
        streamed = StreamedWeights(model, MappedCheckpoint(ckpt), (layer,))
        extra["outside_hiera_parameters"] = streamed.bind_outside()
        loaded = time.perf_counter()
        with streamed.hooks():
            result = capture_model(model.eval(), (ids,), hiera=[HIERA], dynamo=dynamo)
        extra["layer_calls"] = streamed.calls
        extra["hiera_bytes_bound_at_most"] = streamed.bound_peak
        extra["meta_parameters_after"] = sum(p.is_meta for p in model.parameters())
    result.save(out / mode)
    return {
        "mode": mode,
        "dynamo": dynamo,
        "load_s": round(loaded - started, 2),
        "capture_s": round(time.perf_counter() - loaded, 2),
        **extra,
    }


def _checkpoint_weights(model: Any, streamed: StreamedWeights, prefix: str) -> int:
    """Point initializers still on the meta device at the mapped checkpoint (by name)."""
    from onnx_ir.tensor_adapters import TorchTensor

    swapped = 0
    for name, value in model.graph.initializers.items():
        raw = getattr(value.const_value, "raw", None)
        if isinstance(raw, torch.Tensor) and raw.is_meta:
            local = name.removeprefix("inner.")
            stored = streamed._stored_name(f"{prefix}{local}")
            # Same dtype: a view of the mapped bytes; else a converted copy (not a reference).
            tensor = streamed._tensor(stored, raw.dtype)
            value.const_value = TorchTensor(tensor, name=name)
            swapped += 1
    return swapped


@contextlib.contextmanager
def streamed_export(streamed: StreamedWeights, counts: dict[str, int]) -> Iterator[None]:
    """Prototype-only patch of the TorchScript path: a unit's module is bound while it is
    exported; weights left on the meta device (the root's placeholders take every layer's
    weights as inputs) are read from the checkpoint by name. The implementation does this in
    ``export/`` itself (docs/streaming.md)."""
    from hyperexport.library.export.torchscript import TorchScriptPath

    original = TorchScriptPath._export_one

    def export_one(self: Any, job: Any, *args: Any, **kwargs: Any) -> Any:
        path = job.module_path
        scope = streamed.bound(path) if path in streamed.streamed else contextlib.nullcontext()
        with scope:
            unit = original(self, job, *args, **kwargs)
        counts[path or "root"] = _checkpoint_weights(unit, streamed, f"{path}." if path else "")
        counts[f"{path or 'root'} initializers"] = len(unit.graph.initializers)
        return unit

    TorchScriptPath._export_one = export_one  # type: ignore[method-assign]
    try:
        yield
    finally:
        TorchScriptPath._export_one = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _phase(phases: dict[str, Any], name: str) -> Iterator[None]:
    """Sample this process's memory for the duration; the peaks go to ``phases[name]``."""
    with Sampler(os.getpid(), interval=0.1) as sampler:
        yield
    phases[name] = sampler.peaks


def export(ckpt: Path, out: Path, dtype: str, seq: int) -> dict[str, Any]:
    """Streamed capture, export, compose and check (TorchScript path, per_type), end to end."""
    import transformers

    from hyperexport import ExportOptions
    from hyperexport.library.api import capture_model, compose_model, save_model
    from hyperexport.library.check import CheckSettings, run_checks
    from hyperexport.library.export.units import export_units

    config = json.loads((ckpt / "config.json").read_text())
    ids = _inputs(config, seq)
    auto = transformers.AutoConfig.from_pretrained(ckpt)
    auto.use_cache = False
    with parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(auto, dtype=getattr(torch, dtype))
    model.eval()
    layer = type(model.model.layers[0])
    streamed = StreamedWeights(model, MappedCheckpoint(ckpt), (layer,))
    streamed.bind_outside()
    target = out / f"export_{dtype}"
    options = ExportOptions(functions="per_type")
    counts: dict[str, int] = {}
    started = time.perf_counter()
    phases: dict[str, Any] = {}
    with _phase(phases, "trace"), streamed.hooks():  # layers bound while they run
        capture = capture_model(model, (ids,), hiera=[HIERA], dynamo=False)
    captured = time.perf_counter()
    # The export stage: no hooks (a placeholder's forward must see the meta parameters the
    # tracer registered, not freshly bound ones); each layer unit bound while it is exported.
    with _phase(phases, "export+compose+save"):
        with streamed_export(streamed, counts):
            bundle = target / "bundle"
            export_units(model, capture, opset=18, dynamo=False, options=options, out_dir=bundle)
        onnx_model, manifest = compose_model(bundle, options=options, record=capture.record)
        save_model(onnx_model, target / "model.onnx", external_data=True, consume_bundle=True)
    exported = time.perf_counter()
    with _phase(phases, "check"):
        report = run_checks(
            target / "model.onnx", manifest, capture.record, capture.arrays, CheckSettings()
        )
    lines = report.summary_lines()
    return {
        "mode": f"export_{dtype}",
        "phases_peak_anon_gb": {k: round(v.anon / 1e9, 3) for k, v in phases.items()},
        "phases_peak_rss_gb": {k: round(v.rss / 1e9, 3) for k, v in phases.items()},
        "trace_s": round(captured - started, 2),
        "export_s": round(exported - captured, 2),
        "check_s": round(time.perf_counter() - exported, 2),
        "weights_from_checkpoint": counts,
        "meta_parameters_after": sum(p.is_meta for p in model.parameters()),
        "check_ok": report.ok,
        "check": [line.strip() for line in lines[:8]],
    }


def compare(out: Path) -> dict[str, Any]:
    import numpy as np

    from hyperexport.library.capture.container import Capture

    eager, stream = Capture.load(out / "eager"), Capture.load(out / "stream")
    assert eager.record == stream.record, "the capture records differ"
    assert set(eager.arrays) == set(stream.arrays)
    for key, array in eager.arrays.items():
        assert array.dtype == stream.arrays[key].dtype and np.array_equal(
            array, stream.arrays[key]
        ), key
    return {"same_record": True, "arrays_bitwise_equal": len(eager.arrays)}


def _measured(fn: Any, *args: Any) -> dict[str, Any]:
    with Sampler(os.getpid(), interval=0.1) as sampler:
        figures = fn(*args)
    peaks = sampler.peaks
    return {
        **figures,
        "peak_anon_gb": round(peaks.anon / 1e9, 3),
        "peak_rss_gb": round(peaks.rss / 1e9, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=["eager", "stream", "export"])
    parser.add_argument("--dtype", default="bfloat16", help="--mode export: the model's dtype")
    parser.add_argument("--compare", action="store_true")
    parser.add_argument("--all", action="store_true")
    parser.add_argument("--dynamo", action="store_true")
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()
    if args.all:
        base = [sys.executable, __file__, str(args.ckpt), str(args.out), "--seq", str(args.seq)]
        base += ["--dynamo"] if args.dynamo else []
        for extra in (["--mode", "eager"], ["--mode", "stream"], ["--compare"]):
            subprocess.run([*base, *extra], check=True)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.compare:
        print(json.dumps(compare(args.out)), flush=True)
        return
    if args.mode == "export":
        figures = _measured(export, args.ckpt, args.out, args.dtype, args.seq)
    else:
        figures = _measured(capture, args.ckpt, args.out, args.mode, args.dynamo, args.seq)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
