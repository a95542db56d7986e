"""The version bridge: the one module that knows where torch, transformers, onnx and onnxscript
differ between releases, and the only one allowed private torch APIs.

Everything else in hyperexport uses public APIs, and asks this module

* which releases are installed (:func:`installed_versions`, read from package metadata without
  importing the libraries; what a model's metadata and a build's report record);
* whether they work together (:func:`unsupported`, asked before an export starts: one line
  naming both versions, instead of an import error from deep inside torch);
* where torch moved or changed (the private hooks below: tracing state, exporter caches);
* how to swap transformers' attention and masking hooks, whose signatures and names changed
  between 4.57 and 5.x (:func:`transformers_hooks`).

It sits on the lowest layer: it imports only torch, transformers, onnx and onnxscript (lazily,
inside functions, so that torch-free layers may read versions through it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata as metadata
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

if TYPE_CHECKING:
    import torch

#: The libraries whose versions a model records (``metadata_props``) and ``hyperexport show``
#: prints, in this order.
RECORDED_DISTRIBUTIONS = (
    "torch",
    "transformers",
    "onnxscript",
    "onnx",
    "onnxruntime",
    "hyperexport",
)


@functools.lru_cache(maxsize=64)
def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (local suffix kept), or None if absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(names: tuple[str, ...] = RECORDED_DISTRIBUTIONS) -> dict[str, str]:
    """``{distribution: version}`` of the installed ones among ``names``, in that order."""
    found = {name: installed_version(name) for name in names}
    return {name: version for name, version in found.items() if version is not None}


def _release(name: str) -> Version | None:
    """The installed release of ``name`` without its local suffix (``2.13.0+cpu`` -> 2.13.0)."""
    text = installed_version(name)
    return Version(text.split("+")[0]) if text is not None else None


def _at_least(name: str, release: str) -> bool:
    """Whether ``name`` is installed at ``release`` or later."""
    found = _release(name)
    return found is not None and found >= Version(release)


@dataclass(frozen=True)
class Requirement:
    """``needs`` at ``at_least`` whenever ``when`` is at ``from_release`` or later.

    Attributes:
        when: The distribution whose release brings the requirement (``"torch"``).
        from_release: Its first release with the requirement.
        needs: The distribution required.
        at_least: Its lowest working release.
        paths: The export paths that need it (``"dynamo"``, ``"torchscript"``).
        reason: What fails otherwise.
    """

    when: str
    from_release: str
    needs: str
    at_least: str
    paths: tuple[str, ...]
    reason: str


#: Combinations known not to work. Each was seen failing; each message names both versions.
REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        when="torch",
        from_release="2.11",
        needs="onnxscript",
        at_least="0.6.0",
        paths=("dynamo",),
        reason="torch's dynamo exporter imports onnxscript._framework_apis.torch_2_11",
    ),
    Requirement(
        when="torch",
        from_release="2.11",
        needs="onnx-ir",
        at_least="0.1.16",
        paths=("dynamo",),
        reason="torch's dynamo exporter reads onnx_ir.schemas, which onnx-ir 0.1.16 brings",
    ),
)


def unsupported(dynamo: bool) -> list[str]:
    """One line per known-broken combination of the installed libraries on this export path."""
    path = "dynamo" if dynamo else "torchscript"
    problems = []
    for req in REQUIREMENTS:
        if path not in req.paths or not _at_least(req.when, req.from_release):
            continue
        if _at_least(req.needs, req.at_least):
            continue
        problems.append(
            f"{req.when} {installed_version(req.when)} needs {req.needs}>={req.at_least} on the "
            f"{path} path, found {req.needs} {installed_version(req.needs) or '(not installed)'}"
            f" ({req.reason})"
        )
    return problems


# -- transformers ---------------------------------------------------------------------------------


#: transformers classes hyperexport names (zoo recipes' hiera, the MoE patch) that appeared in a
#: later release than transformers' floor, by class name: (first release, what they are).
#: 4.57's MoE blocks are one module with a router Linear and a list of expert MLPs.
TRANSFORMERS_CLASSES_SINCE: dict[str, tuple[str, str]] = {
    name: ("5", "5.x splits sparse MoE blocks into a router and an experts module")
    for name in (
        "MixtralTopKRouter",
        "MixtralExperts",
        "Qwen2MoeTopKRouter",
        "Qwen2MoeExperts",
        "OlmoeTopKRouter",
        "OlmoeExperts",
    )
}


def missing_transformers_class(path: str) -> str | None:
    """One line naming both versions when ``path`` (``transformers.models....ClassName``) is a
    class the installed transformers is too old to have (:data:`TRANSFORMERS_CLASSES_SINCE`);
    None otherwise (including when the class is unknown here: the caller's own error stands)."""
    if not path.startswith("transformers."):
        return None
    name = path.rpartition(".")[2]
    since = TRANSFORMERS_CLASSES_SINCE.get(name)
    if since is None or _at_least("transformers", since[0]):
        return None
    found = installed_version("transformers") or "(not installed)"
    return f"transformers {found} has no {name}: it needs transformers>={since[0]} ({since[1]})"


def transformers_version() -> str | None:
    """The installed transformers version, or None when transformers is not installed."""
    return installed_version("transformers")


def torch_version() -> str | None:
    """The installed torch version, or None when torch is not installed."""
    return installed_version("torch")


def release_in(version: str, specifier: str) -> bool:
    """Whether release ``version`` (``"4.57.6"``) satisfies ``specifier`` (``">=4.54"``)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(specifier).contains(Version(version.split("+")[0]), prereleases=True)


def cache_keyword() -> str:
    """The keyword transformers models and their decoder layers take the KV cache by.

    ``cache`` from 5.x (where ``past_key_values`` is a deprecated alias, until 5.40);
    ``past_key_values`` in 4.57, whose layers would take ``cache`` into ``**kwargs`` and ignore it.
    """
    return "cache" if _at_least("transformers", "5") else "past_key_values"


def layers_return_tuples() -> bool:
    """Whether transformers' decoder layers return a tuple even of one tensor (4.57: their
    stacks take ``[0]``); 5.x layers return the tensor itself."""
    return not _at_least("transformers", "5")


def query_position_arguments(module: Any, length: int) -> dict[str, Any]:
    """The query's positions, for an attention module whose forward asks for them.

    transformers 4.57's attention modules take them as ``cache_position`` and (T5, whose
    cross-attention sizes its position bias by it and ignores ``cache_position``) as
    ``query_length``; 5.x removed both.

    Returns:
        ``cache_position`` (``arange(length)``) and ``query_length`` (``length``), each only if
        ``module.forward`` takes it.
    """
    import inspect

    import torch

    parameters = inspect.signature(module.forward).parameters
    found: dict[str, Any] = {}
    if "cache_position" in parameters:
        found["cache_position"] = torch.arange(length)
    if "query_length" in parameters:
        found["query_length"] = length
    return found


#: transformers model classes whose attention reaches ``AttentionInterface`` (so
#: ``attention.implementation``) only from a release on: before it, their attention modules are
#: chosen once when the model is built (4.x's ``BertSdpaSelfAttention``), and switching the
#: implementation changes nothing (the capture warns).
ATTENTION_INTERFACE_SINCE: dict[str, str] = {"BertModel": "5"}


def attention_interface_reached(model_class: str) -> bool:
    """Whether the installed transformers routes ``model_class``'s attention (a class name,
    ``"BertModel"``) through ``AttentionInterface`` (:data:`ATTENTION_INTERFACE_SINCE`)."""
    since = ATTENTION_INTERFACE_SINCE.get(model_class)
    return since is None or _at_least("transformers", since)


def masks_built_by_vmap(transformers: str | None = None) -> bool:
    """Whether transformers builds SDPA masks with its vmapped builder (4.x's
    ``sdpa_mask_recent_torch``; 5.x broadcasts index tensors instead).

    ``torch.jit.trace`` fails on it (``RuntimeError: unordered_map::at``), so a plain TorchScript
    export of a decoder that builds such a mask fails at export; hyperexport swaps in
    :func:`traceable_sdpa_mask`. Tests and the zoo's expected failures key on it.

    Args:
        transformers: A transformers release (``"4.57.6"``); the installed one when None.
    """
    found = transformers if transformers is not None else transformers_version()
    return found is not None and release_in(found, "<5")


def masking_export_flags() -> list[tuple[Any, str]]:
    """The functions that tell transformers' mask creation it runs under ``torch.export`` (then
    it always builds the SDPA mask instead of skipping it), as ``(module, name)`` pairs.

    transformers 5.x asks ``masking_utils.is_torchdynamo_exporting()``. 4.57 asks
    ``is_torchdynamo_compiling()`` for the same decision, in ``masking_utils`` (decoders) and in
    ``modeling_attn_mask_utils`` (the older mask helpers that BERT's SDPA path still uses).

    Returns:
        The pairs; empty when the installed transformers has none of them.
    """
    from transformers import masking_utils

    if callable(getattr(masking_utils, "is_torchdynamo_exporting", None)):
        return [(masking_utils, "is_torchdynamo_exporting")]
    if not callable(getattr(masking_utils, "is_torchdynamo_compiling", None)):
        return []
    flags: list[tuple[Any, str]] = [(masking_utils, "is_torchdynamo_compiling")]
    # 4.x only (typed against the pinned 5.x, which has no such module).
    modeling_attn_mask_utils: Any = importlib.import_module("transformers.modeling_attn_mask_utils")
    if callable(getattr(modeling_attn_mask_utils, "is_torchdynamo_compiling", None)):
        flags.append((modeling_attn_mask_utils, "is_torchdynamo_compiling"))
    return flags


#: What :func:`traceable_sdpa_mask` builds on: transformers 4.x ``masking_utils`` helpers.
_SDPA_MASK_PARTS = (
    "prepare_padding_mask",
    "_ignore_causal_mask_sdpa",
    "and_masks",
    "padding_mask_function",
    "causal_mask_function",
)


#: The torch releases whose ``torch.export`` cannot trace transformers 4.x's vmapped SDPA mask
#: builder at dynamic sizes, so that the dynamo path builds masks with :func:`traceable_sdpa_mask`
#: too. torch 2.9.1 with transformers 4.57.6: torch's own
#: ``torch.onnx.export(dynamo=True, dynamic_shapes=...)`` of a tiny ``LlamaModel`` fails in
#: ``sdpa_mask_recent_torch`` (the vmapped ``packed_sequence_mask[batch_idx, q_idx]`` under
#: ``TransformGetItemToIndex``) with ``RuntimeError: 8*s72 is not tracked with proxy for
#: <_ModuleStackTracer>``, with ``Dim`` and with ``Dim.AUTO`` alike; static shapes export. torch
#: 2.13.0 exports the same model (the ``cheap`` leg). 2.10 to 2.12 were not run with 4.57, so they
#: get the bridge, which builds the same mask (tests/transformers/test_patches.py).
VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT = "<2.13"


def export_fails_on_vmapped_masks() -> bool:
    """Whether torch's own ``torch.export`` of a transformers decoder with dynamic shapes fails on
    its SDPA mask with the installed pair: transformers builds masks by vmapping (4.x, where
    :func:`traceable_sdpa_mask` has a builder to put in its place) and torch is one of
    :data:`VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`. Tests use it for a strict xfail of torch's own
    export; hyperexport's dynamo path bridges it (``broadcast_sdpa_mask_for_torch_export`` in
    :mod:`hyperexport.transformers.patches`)."""
    found = torch_version()
    if found is None or not release_in(found, VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT):
        return False
    return installed_version("transformers") is not None and traceable_sdpa_mask() is not None


def traceable_sdpa_mask() -> Any:
    """transformers 4.x's SDPA mask builder, rewritten so that the TorchScript tracer can trace it
    at any batch size and length (and ``torch.export`` below torch 2.13, at dynamic sizes:
    :data:`VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`).

    transformers 4.57 builds masks on torch >= 2.6 with ``sdpa_mask_recent_torch``, which vmaps
    the mask function under ``TransformGetItemToIndex`` (a custom autograd function): traced by
    ``torch.jit.trace`` it fails with ``RuntimeError: unordered_map::at``. Its
    ``sdpa_mask_older_torch`` traces, but vmap's batching rules reshape with the traced sizes
    (``Reshape`` to ``[16, 1]`` for a 16-token trace), so the model fails at any other length.
    The builder returned here does what 5.x's ``sdpa_mask`` does by default (and what Optimum
    patches into 4.x): it calls the mask function once on index tensors shaped to broadcast
    over (batch, head, query, key), so every size comes from the traced inputs. Same arguments
    and same mask as 4.57's builder (``cache_position`` gives the query indices) for mask
    functions that only index (causal, sliding-window, padding and packed-sequence masks are
    compared with 4.57's builder in tests/transformers/test_patches.py).

    Returns:
        The builder, or None when the installed transformers is not 4.x-like (no vmapped
        ``sdpa_mask_recent_torch``, or none of the helpers the builder uses).
    """
    import torch

    # Typed as Any: these are 4.x's helpers and signatures; mypy sees the pinned 5.x.
    masking_utils: Any = importlib.import_module("transformers.masking_utils")

    if not all(callable(getattr(masking_utils, name, None)) for name in _SDPA_MASK_PARTS):
        return None
    if not hasattr(masking_utils, "sdpa_mask_recent_torch"):
        return None  # 5.x: no vmapped builder to replace, and another signature

    def sdpa_mask_by_broadcasting(
        batch_size: int,
        cache_position: torch.Tensor,
        kv_length: int,
        kv_offset: int = 0,
        mask_function: Any = masking_utils.causal_mask_function,
        attention_mask: torch.Tensor | None = None,
        local_size: int | None = None,
        allow_is_causal_skip: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor | None:
        q_length = cache_position.shape[0]
        padding_mask = masking_utils.prepare_padding_mask(
            attention_mask, kv_length, kv_offset, _slice=False
        )
        if allow_is_causal_skip and masking_utils._ignore_causal_mask_sdpa(
            padding_mask, q_length, kv_length, kv_offset, local_size
        ):
            return None
        if padding_mask is not None:
            mask_function = masking_utils.and_masks(
                mask_function, masking_utils.padding_mask_function(padding_mask)
            )
        device = cache_position.device
        kv_index = torch.arange(kv_length, device=device) + kv_offset
        mask = mask_function(
            torch.arange(batch_size, device=device)[:, None, None, None],
            torch.arange(1, device=device)[None, :, None, None],
            cache_position[None, None, :, None],
            kv_index[None, None, None, :],
        )
        return mask.expand(batch_size, -1, q_length, kv_length)

    return sdpa_mask_by_broadcasting


def never_gqa(*args: Any, **kwargs: Any) -> bool:
    """Stand-in for transformers' ``sdpa_attention.use_gqa_in_sdpa``: always False.

    Takes any arguments: the hook is ``(attention_mask, key)`` in 4.57 and
    ``(attention_mask, key, value)`` in 5.x.
    """
    return False


@contextlib.contextmanager
def quiet_torchscript_exporter() -> Iterator[None]:
    """Silence the TorchScript exporter's per-call deprecation and tracer warnings.

    torch 2.13 warns on every ``dynamo=False`` export; a hierarchical export makes one call per
    unit, so the same warning would repeat for every module.
    """
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx.*")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def is_tracing() -> bool:
    """True while torch.jit tracing (the TorchScript exporter) runs."""
    import torch

    return torch.jit.is_tracing()


def pause_tracing() -> object:
    """Stop the TorchScript tracer recording ops; returns the state to give back to
    :func:`resume_tracing`. Tensors made meanwhile enter the trace as constants."""
    import torch

    state = torch._C._get_tracing_state()
    torch._C._set_tracing_state(None)  # type: ignore[attr-defined]
    return state


def resume_tracing(state: object) -> None:
    """Undo :func:`pause_tracing`."""
    import torch

    torch._C._set_tracing_state(state)  # type: ignore[attr-defined]


def size_of(count: torch.Tensor, at_most: int) -> int:
    """The integer in 0-d ``count`` as a size: a plain int eagerly, an unbacked size (bounded by
    ``0 <= size <= at_most``) under ``torch.export``, where ``int(count)`` would fail on a
    data-dependent value."""
    import torch

    size = count.item()
    torch._check(size >= 0)
    torch._check(size <= at_most)
    return size  # type: ignore[return-value]


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


#: Every dtype torch defines, by :func:`torch_dtype_name`. Looked up in this table, never with
#: ``getattr(torch, name)``: a name read back from a cached record must not reach torch's lazy
#: submodule importer.
@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    import torch

    return {torch_dtype_name(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`torch_dtype_name`.

    Raises:
        ValueError: ``name`` is not a torch dtype.
    """
    dtype = _dtypes().get(name)
    if dtype is None:
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def pytree_node_types() -> tuple[type, ...]:
    """The container classes registered with torch's pytree in this process.

    transformers registers every ``ModelOutput`` subclass there when its module is imported;
    the capture's tree decoder rebuilds only registered classes (``capture/tree.py``).
    """
    from torch.utils import _pytree

    return tuple(_pytree.SUPPORTED_NODES)


def set_symbolic_output_type(value: object, like: torch.Tensor, sizes: list[int | None]) -> None:
    """Give a TorchScript symbolic output the dtype of ``like`` and ``sizes`` (None: unknown).

    Without it, the TorchScript exporter warns for every custom op and loses the shape
    information that later symbolics (e.g. Linear -> Gemm vs MatMul) decide on.
    """
    import torch

    tensor_type = torch._C.TensorType.create_from_tensor(like).with_sizes(sizes)
    value.setType(tensor_type)  # type: ignore[attr-defined]


#: torch.onnx's dynamo registries by opset, built once per process (see dynamo_export_caches).
_ONNX_REGISTRIES: dict[int, object] = {}
#: torch.export's set of CompositeImplicitAutograd ops, keyed by the op namespaces it covered.
_CIA_OPS: dict[frozenset[str], object] = {}


@contextlib.contextmanager
def dynamo_export_caches() -> Iterator[None]:
    """Let ``torch.onnx.export(dynamo=True)`` reuse what it rebuilds on every call, while open.

    A hierarchical export makes one call per unit, and two per-call costs of torch 2.13 would
    make most of its overhead over a plain export:

    * the registry of torchlib translations (about a second: it parses the source of every
      torchlib function), kept per opset;
    * the set of CompositeImplicitAutograd ops that ``run_decompositions`` preserves (about
      0.2 s: it walks every op of every namespace), kept per set of op namespaces. An op of an
      existing namespace registered after the first export is not seen until the process
      restarts.

    Both are built on first use and kept for the process; only calls inside this context see
    them. Translations passed in ``custom_translation_table`` are registered into the shared
    registry and stay there: callers must only pass ops whose translation never changes
    (hyperexport's placeholder ops, which are themselves defined once per process).
    """
    import torch
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _registration

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    default_opset = original.__func__.__defaults__[0]
    collect = exported_program._collect_all_valid_cia_ops

    def from_torchlib(cls: type, opset_version: int = default_opset) -> object:
        if opset_version not in _ONNX_REGISTRIES:
            _ONNX_REGISTRIES[opset_version] = original.__func__(cls, opset_version=opset_version)
        return _ONNX_REGISTRIES[opset_version]

    def collect_cia_ops() -> object:
        key = frozenset(torch.ops._dir)
        if key not in _CIA_OPS:
            _CIA_OPS[key] = collect()
        return _CIA_OPS[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)  # type: ignore[method-assign,assignment]
    exported_program._collect_all_valid_cia_ops = collect_cia_ops  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = original  # type: ignore[method-assign]
        exported_program._collect_all_valid_cia_ops = collect  # type: ignore[attr-defined]


def export_refuses_one_token_guards() -> bool:
    """Whether ``torch.export`` fails a dynamic length that the model compares with 1.

    transformers' mask and attention code branches on a query length of 1; torch 2.9's
    ``torch.export`` turns that branch into a guard ``new_len != 1`` and refuses the dynamic
    dimension (``Constraints violated (new_len)``), where 2.11 keeps it dynamic. Seen on 2.9.1,
    not on 2.11.0; 2.10 was not run, so it counts as the older behaviour. Tests use it for a
    strict xfail of torch's own export.
    """
    return not _at_least("torch", "2.11")


@contextlib.contextmanager
def decomposition_without_input_guards() -> Iterator[None]:
    """Let ``run_decompositions`` unlift a program with dynamic shapes on torch 2.9.

    torch 2.9's ``ExportedProgram.module()`` inserts a ``_guards_fn`` whose generated code names
    dynamo's ``L[...]`` sources, and ``torch.onnx.export(dynamo=True)`` calls it while it
    decomposes: ``NameError: name 'L' is not defined`` (pytorch/pytorch#172903). Later releases
    rewrite those names to the signature's (``_unlift._force_ep_signature_match``, present from
    2.11). The guards only check a call's inputs and never reach the ONNX graph, so while open,
    and only where that rewrite is missing, ``module()`` is built without them.
    """
    from torch.export import _unlift
    from torch.export.exported_program import ExportedProgram

    if hasattr(_unlift, "_force_ep_signature_match"):
        yield
        return
    original = ExportedProgram.module

    def module(self: ExportedProgram, check_guards: bool = False) -> Any:
        return original(self, check_guards=check_guards)

    ExportedProgram.module = module  # type: ignore[method-assign]
    try:
        yield
    finally:
        ExportedProgram.module = original  # type: ignore[method-assign]


#: Weights at least this large are kept out of the TorchScript exporter's shape inference.
_SHAPE_INFERENCE_VALUE_LIMIT = 1 << 20


@contextlib.contextmanager
def weights_out_of_shape_inference() -> Iterator[None]:
    """Keep large weights' values out of the TorchScript exporter's ONNX shape inference.

    ``_jit_pass_onnx_graph_shape_type_inference`` copies every parameter value it is given
    into the protobuf of each node that reads it (the embedding table into its Gather node),
    twice per export: a transient copy of the largest weights. Shape inference needs values
    only for shape-like constants, never for weights (their shapes and types are on the graph),
    so tensors of at least 1 MiB are left out of the dict it sees. Restored on exit.
    """
    import torch

    original = torch._C._jit_pass_onnx_graph_shape_type_inference

    def infer(graph: Any, params_dict: dict[str, Any], opset: int) -> None:
        small = {
            k: v
            for k, v in params_dict.items()
            if not isinstance(v, torch.Tensor)
            or v.numel() * v.element_size() < _SHAPE_INFERENCE_VALUE_LIMIT
        }
        original(graph, small, opset)

    torch._C._jit_pass_onnx_graph_shape_type_inference = infer  # type: ignore[assignment]
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original
