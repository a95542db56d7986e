"""Which library patches and registrations an export needs, entered around capture and export."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

log = logging.getLogger(__name__)


def _from_transformers(model: torch.nn.Module) -> bool:
    return _transformers_name(model) is not None


def _transformers_name(model: torch.nn.Module) -> str | None:
    """The class name of ``model``, or of the first child (a wrapped root), from transformers."""
    for module in (model, *model.children()):
        if type(module).__module__.startswith("transformers."):
            return type(module).__name__
    return None


@contextlib.contextmanager
def export_context(
    model: torch.nn.Module, dynamo: bool, attention: str | None = None
) -> Iterator[dict[Any, Callable[..., Any]]]:
    """Enter hyperexport's transformers patches and, if asked, its attention registration.

    The same context must be active during capture and export, so that both see the same module
    inputs: mask creation is patched, and the attention entry brings its own mask function.

    Args:
        model: The model being captured or exported.
        dynamo: The export path.
        attention: Name of the transformers attention implementation to switch the model to
            (``"hyperexport"`` exports attention as one node per call), or None.

    Yields:
        Extra ``custom_translation_table`` entries for the dynamo path (empty otherwise).
    """
    with contextlib.ExitStack() as stack:
        table: dict[Any, Callable[..., Any]] = {}
        if _from_transformers(model):
            from hyperexport.library.transformers.patches import export_patches

            stack.enter_context(export_patches(dynamo))
        if attention is not None:
            from hyperexport.library.transformers.attention import attention_export_context

            table = stack.enter_context(attention_export_context(attention, dynamo, model))
        yield table


@contextlib.contextmanager
def attention_reached(model: torch.nn.Module, attention: str | None) -> Iterator[None]:
    """Around the model's forward: a WARNING when ``attention`` was asked for a transformers
    model and not one call reached it (its attention modules do not go through transformers'
    ``AttentionInterface`` in the installed release): the attention is then exported as plain
    ops, which ``rewrite.fuse`` cannot make one kernel."""
    if attention is None or not _from_transformers(model):
        yield
        return
    from hyperexport.base.versions import transformers_version
    from hyperexport.library.transformers.attention import attention_calls

    before = attention_calls()
    yield
    if attention_calls() == before:
        log.warning(
            "attention.implementation=%s: no attention call of %s reached it (its attention "
            "does not go through transformers' AttentionInterface in transformers %s); the "
            "attention is exported as plain ops, and rewrite.fuse cannot make it one kernel",
            attention,
            _transformers_name(model),
            transformers_version(),
        )
