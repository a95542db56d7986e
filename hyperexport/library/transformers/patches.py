"""Patches that let transformers models go through ``torch.onnx.export``.

Each patch is a small context manager that swaps one transformers attribute and restores it in
``finally``. A patch is keyed to the transformers versions and the export paths where it is
needed; :func:`export_patches` enters every patch that applies and leaves them in reverse order.

Measured with transformers 5.24 on torch 2.13 (tiny Llama, Qwen2, GPT-2, BERT, ViT from
:mod:`hyperexport.library.zoo`, opset 18): the dynamo path exports all five without patches; the
TorchScript path fails for the three decoders on ``aten::diff`` from mask creation, and, once
that is removed, on a ``CumSum`` of a boolean tensor (invalid ONNX). Both come from
``masking_utils.find_packed_sequence_indices``, which :func:`packed_sequence_without_diff` fixes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.base.errors import VersionsError
from hyperexport.base.versions import (
    TRANSFORMERS_MASKING_UTILS,
    TRANSFORMERS_SKIPS_MASKS_WHEN_TRACED,
    VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT,
    masking_export_flags,
    release_in,
    torch_version,
    transformers_version,
)
from hyperexport.library.transformers.masks import never_gqa, traceable_sdpa_mask

log = logging.getLogger(__name__)

TORCHSCRIPT = "torchscript"
DYNAMO = "dynamo"


@dataclass(frozen=True)
class ExportPatch:
    """One transformers patch and where it is needed.

    Attributes:
        name: Short identifier, logged when the patch is applied.
        transformers: Version specifier of the transformers releases that need it.
        paths: Export paths (``"torchscript"``, ``"dynamo"``) that need it.
        reason: What breaks without it.
        factory: Returns the context manager that applies the patch and restores on exit.
        torch_releases: Version specifier of the torch releases that need it (declared in
            :mod:`hyperexport.base.versions`); empty for every release.
    """

    name: str
    transformers: str
    paths: tuple[str, ...]
    reason: str
    factory: Callable[[], AbstractContextManager[None]]
    torch_releases: str = ""

    def applies(self, dynamo: bool, version: str, torch_release: str | None = None) -> bool:
        """Whether the patch is needed on this export path with this transformers version and
        this torch version (None: unknown, which satisfies any torch specifier)."""
        path = DYNAMO if dynamo else TORCHSCRIPT
        if path not in self.paths or not release_in(version, self.transformers):
            return False
        if not self.torch_releases or torch_release is None:
            return True
        return release_in(torch_release, self.torch_releases)


@contextmanager
def _swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``owner.name`` to ``value`` for the duration; restore the original in ``finally``."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _find_packed_sequence_indices(position_ids: torch.Tensor) -> torch.Tensor | None:
    """``find_packed_sequence_indices`` without ``torch.diff`` and without a boolean ``cumsum``.

    Same result as transformers' version: a new sequence starts wherever a position is not the
    previous position plus one; the running count of starts numbers the sequences.

    Unlike transformers' version, the "no packed sequences" answer is also given while tracing:
    the TorchScript tracer runs on real values, so the branch is decided by the traced
    ``position_ids`` exactly as eager decides it (the tracer bakes the branch). Without this,
    the graph always carries the packed-sequence mask, whose advanced indexing the TorchScript
    exporter lowers with the traced batch size baked in, so the model fails at another batch
    size. Trace with packed ``position_ids`` to export the packed-sequence path.
    """
    previous = torch.cat([position_ids[:, :1] - 1, position_ids[:, :-1]], dim=-1)
    starts = (position_ids - previous) != 1
    packed_sequence_mask = starts.to(torch.int64).cumsum(-1)
    if bool((packed_sequence_mask[:, -1] == 0).all()):
        return None
    return packed_sequence_mask


@contextmanager
def packed_sequence_without_diff() -> Iterator[None]:
    """Replace ``transformers.masking_utils.find_packed_sequence_indices`` during export.

    The original uses ``torch.diff`` (no TorchScript symbolic at any opset up to 20) and a
    ``cumsum`` over booleans, which the TorchScript exporter emits as an invalid ``CumSum`` on
    ``tensor(bool)``. The replacement computes the same packed-sequence ids with ``Sub``/``Concat``
    and an int64 ``CumSum``.
    """
    from transformers import masking_utils

    with _swapped(masking_utils, "find_packed_sequence_indices", _find_packed_sequence_indices):
        yield


@contextmanager
def sdpa_without_enable_gqa() -> Iterator[None]:
    """Make transformers' SDPA integration repeat key/value heads instead of ``enable_gqa``.

    With no mask (the causal case once packed-sequence detection answers "none"), transformers
    asks SDPA for ``enable_gqa=True``, which the TorchScript exporter cannot convert
    ("conversion of scaled_dot_product_attention not implemented if enable_gqa is True").
    Repeating the heads computes the same attention. (The hook's arguments differ between 4.57
    and 5.x; :func:`~hyperexport.library.transformers.masks.never_gqa` takes either.)
    """
    from transformers.integrations import sdpa_attention

    with _swapped(sdpa_attention, "use_gqa_in_sdpa", never_gqa):
        yield


@contextmanager
def masks_as_under_torch_export() -> Iterator[None]:
    """Make transformers build attention masks as it does under ``torch.export``.

    Eagerly, transformers skips the SDPA mask (passes ``None``) when nothing is masked; under
    ``torch.export`` it always builds one (``masking_utils.is_torchdynamo_exporting()``; in 4.x
    ``is_torchdynamo_compiling()`` in one or two modules, see
    :func:`~hyperexport.base.versions.masking_export_flags`). The capture runs eagerly for the dynamo
    path, so without this a decoder layer has one tensor input fewer at capture than at export,
    and the placeholder cannot stand in for it.
    """
    flags = masking_export_flags()
    if not flags:
        raise VersionsError(
            f"transformers {transformers_version()}: neither masking_utils nor "
            "modeling_attn_mask_utils has is_torchdynamo_exporting or is_torchdynamo_compiling; "
            "the dynamo path cannot make it build the SDPA mask"
        )
    with ExitStack() as stack:
        for owner, name in flags:
            stack.enter_context(_swapped(owner, name, _always_true))
        yield


#: What a transformers model module calls to learn whether it runs under ``torch.export`` (or
#: ``torch.compile``), imported into the module's namespace from ``transformers.utils``.
_MODEL_EXPORT_QUESTION = "is_torchdynamo_compiling"


@contextmanager
def model_masks_as_under_torch_export() -> Iterator[None]:
    """Make transformers' model modules skip, as under ``torch.export``, the all-ones attention
    mask they make when given none.

    Several models make one eagerly only (``if attention_mask is None and not
    is_torchdynamo_compiling()``: T5, LongT5 and mT5 on 4.x, BART, mBART, Marian, Pegasus and
    others on 4.x and 5.x); T5 on 4.57 then gives its blocks a mask eagerly and ``None`` under
    export. The capture runs eagerly for the dynamo path, so without this a T5 encoder called
    without a mask had one tensor input fewer at export than at capture. The question is
    answered in every loaded ``transformers.models.*`` module that imported it (the captured
    model's modules are loaded by then), for the capture and the export alike.
    """
    loaded = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("transformers.models.") and module is not None
    ]
    with ExitStack() as stack:
        for module in loaded:
            if callable(getattr(module, _MODEL_EXPORT_QUESTION, None)):
                stack.enter_context(_swapped(module, _MODEL_EXPORT_QUESTION, _always_true))
        yield


def _always_true(*args: Any, **kwargs: Any) -> bool:
    """What each of transformers' "am I exported?" questions answers under ``torch.export``
    (``is_tracing`` takes the tensor it asks about)."""
    return True


@contextmanager
def traceable_sdpa_mask_builder() -> Iterator[None]:
    """Build SDPA masks by broadcasting instead of vmapping during an export (transformers 4.x).

    See :func:`~hyperexport.library.transformers.masks.traceable_sdpa_mask`: 4.57's default builder fails under
    ``torch.jit.trace`` (``unordered_map::at``), its older one bakes the traced length; torch
    2.9's ``torch.export`` fails on the default one at dynamic sizes
    (:data:`~hyperexport.base.versions.VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT`). Both the module's
    ``sdpa_mask`` (which ``eager_mask`` calls) and the ``"sdpa"`` entry of the mask interface are
    swapped.
    """
    from transformers import masking_utils

    builder = traceable_sdpa_mask()
    if builder is None:
        raise VersionsError(
            f"transformers {transformers_version()}: masking_utils lacks the 4.x mask helpers; "
            "the SDPA mask cannot be built by broadcasting"
        )
    mapping = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    with _swapped(masking_utils, "sdpa_mask", builder):
        original = mapping["sdpa"]
        mapping["sdpa"] = builder
        try:
            yield
        finally:
            mapping["sdpa"] = original


@contextmanager
def exportable_moe_patch() -> Iterator[None]:
    """Export Mixtral, Qwen2-MoE and OLMoE blocks with :mod:`hyperexport.library.transformers.moe`."""
    from hyperexport.library.transformers.moe import exportable_moe

    with exportable_moe():
        yield


PATCHES: tuple[ExportPatch, ...] = (
    ExportPatch(
        name="packed_sequence_without_diff",
        transformers=TRANSFORMERS_MASKING_UTILS,
        paths=(TORCHSCRIPT,),
        reason="aten::diff and bool CumSum from masking_utils.find_packed_sequence_indices",
        factory=packed_sequence_without_diff,
    ),
    ExportPatch(
        name="sdpa_without_enable_gqa",
        # before, transformers never skips the mask while tracing, so SDPA always has one and
        # never gets enable_gqa
        transformers=TRANSFORMERS_SKIPS_MASKS_WHEN_TRACED,
        paths=(TORCHSCRIPT,),
        reason="SDPA with enable_gqa=True has no TorchScript symbolic",
        factory=sdpa_without_enable_gqa,
    ),
    ExportPatch(
        name="traceable_sdpa_mask_builder",
        transformers=f"{TRANSFORMERS_MASKING_UTILS},<5",
        paths=(TORCHSCRIPT,),
        reason="4.x's vmapped SDPA mask builder fails under torch.jit.trace (unordered_map::at)",
        factory=traceable_sdpa_mask_builder,
    ),
    ExportPatch(
        name="broadcast_sdpa_mask_for_torch_export",
        transformers=f"{TRANSFORMERS_MASKING_UTILS},<5",
        torch_releases=VMAPPED_MASKS_UNTRACEABLE_BY_EXPORT,
        paths=(DYNAMO,),
        reason=(
            "torch.export of torch < 2.13 cannot trace 4.x's vmapped SDPA mask builder at dynamic "
            "sizes (a size 'is not tracked with proxy'); torch's own export fails too"
        ),
        factory=traceable_sdpa_mask_builder,
    ),
    ExportPatch(
        name="exportable_moe",
        transformers=">=5",
        paths=(TORCHSCRIPT, DYNAMO),
        reason=(
            "MoE experts dispatch with aten::histc (no TorchScript symbolic) and "
            "transformers::grouped_mm_fallback (no ONNX function on dynamo)"
        ),
        factory=exportable_moe_patch,
    ),
    ExportPatch(
        name="masks_as_under_torch_export",
        transformers=">=4.48",
        paths=(DYNAMO,),
        reason="eager capture skips the SDPA mask that torch.export builds",
        factory=masks_as_under_torch_export,
    ),
    ExportPatch(
        name="model_masks_as_under_torch_export",
        transformers=">=4.48",
        paths=(DYNAMO,),
        reason="eager capture makes the all-ones mask that a model skips under torch.export",
        factory=model_masks_as_under_torch_export,
    ),
)


def patches_for(
    dynamo: bool, version: str | None = None, torch_release: str | None = None
) -> list[ExportPatch]:
    """The patches needed on one export path.

    Args:
        dynamo: The export path (``True`` for ``dynamo=True``).
        version: transformers version to key on; the installed one when None.
        torch_release: torch version to key on; the installed one when None.

    Returns:
        The applicable patches, in the order they are entered. Empty without transformers.
    """
    version = version if version is not None else transformers_version()
    if version is None:
        return []
    torch_release = torch_release if torch_release is not None else torch_version()
    return [patch for patch in PATCHES if patch.applies(dynamo, version, torch_release)]


@contextmanager
def export_patches(dynamo: bool, version: str | None = None) -> Iterator[list[str]]:
    """Apply every transformers patch the chosen export path needs; restore them on exit.

    Args:
        dynamo: The export path the patches are for.
        version: transformers version to key on; the installed one when None (tests only).

    Yields:
        The names of the applied patches.
    """
    applied: list[str] = []
    with ExitStack() as stack:
        for patch in patches_for(dynamo, version):
            stack.enter_context(patch.factory())
            applied.append(patch.name)
            log.debug("applied transformers patch %s (%s)", patch.name, patch.reason)
        yield applied
