"""The version facts: what each release of torch, transformers, onnx and onnxscript has, and
the one module that compares their versions (``tests/base/test_versions.py``).

Everything else in hyperexport asks this module

* which releases are installed (:func:`installed_versions`, read from package metadata without
  importing the libraries; what a model's metadata and a build's report record);
* whether they work together (:func:`unsupported`, asked before an export starts: one line
  naming both versions, instead of an import error from deep inside torch);
* what the installed releases have: where transformers takes the KV cache, whether it builds
  masks by vmapping, where its export flags live, whether torch's exporter rewrites guard names.

The shims that act on these facts sit beside what they patch: the mask builder and the
attention hooks with the transformers patches (``transformers/masks.py``), torch's tracing
state, dtypes and pytree in the capture (``capture/torch_hooks.py``), the exporters' caches and
passes in the export (``export/torch_exporter.py``).

It sits on the lowest layer: it imports only torch, transformers, onnx and onnxscript (lazily,
inside functions, so that torch-free layers may read versions through it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as metadata
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

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


#: What the traceable mask builder (``transformers/masks.py``) builds on: transformers 4.x
#: ``masking_utils`` helpers.
_SDPA_MASK_PARTS = (
    "prepare_padding_mask",
    "_ignore_causal_mask_sdpa",
    "and_masks",
    "padding_mask_function",
    "causal_mask_function",
)


def vmapped_sdpa_masks() -> Any:
    """transformers' ``masking_utils`` when it builds SDPA masks by vmapping and has the helpers
    a traceable builder needs (4.x: ``sdpa_mask_recent_torch``); None otherwise (5.x broadcasts
    index tensors, under another signature)."""
    # Typed as Any: these are 4.x's helpers and signatures; mypy sees the pinned 5.x.
    masking_utils: Any = importlib.import_module("transformers.masking_utils")
    if not all(callable(getattr(masking_utils, name, None)) for name in _SDPA_MASK_PARTS):
        return None
    if not hasattr(masking_utils, "sdpa_mask_recent_torch"):
        return None
    return masking_utils


#: The torch releases whose ``torch.export`` cannot trace transformers 4.x's vmapped SDPA mask
#: builder at dynamic sizes, so that the dynamo path builds masks with the traceable builder
#: (``transformers/masks.py``) too. torch 2.9.1 with transformers 4.57.6: torch's own
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
    :func:`vmapped_sdpa_masks` finds what a builder put in its place needs) and torch is one of
    :data:`VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`. Tests use it for a strict xfail of torch's own
    export; hyperexport's dynamo path bridges it (``broadcast_sdpa_mask_for_torch_export`` in
    :mod:`hyperexport.transformers.patches`)."""
    found = torch_version()
    if found is None or not release_in(found, VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT):
        return False
    return installed_version("transformers") is not None and vmapped_sdpa_masks() is not None


def export_refuses_one_token_guards() -> bool:
    """Whether ``torch.export`` fails a dynamic length that the model compares with 1.

    transformers' mask and attention code branches on a query length of 1; torch 2.9's
    ``torch.export`` turns that branch into a guard ``new_len != 1`` and refuses the dynamic
    dimension (``Constraints violated (new_len)``), where 2.11 keeps it dynamic. Seen on 2.9.1,
    not on 2.11.0; 2.10 was not run, so it counts as the older behaviour. Tests use it for a
    strict xfail of torch's own export.
    """
    return not _at_least("torch", "2.11")


def export_guards_name_dynamo_sources() -> bool:
    """Whether torch's ``ExportedProgram.module()`` inserts a ``_guards_fn`` whose generated code
    names dynamo's ``L[...]`` sources, which ``torch.onnx.export(dynamo=True)`` then fails to run
    while it decomposes (torch 2.9, pytorch/pytorch#172903); later releases rewrite those names
    to the signature's (``_unlift._force_ep_signature_match``, present from 2.11)."""
    from torch.export import _unlift

    return not hasattr(_unlift, "_force_ep_signature_match")
