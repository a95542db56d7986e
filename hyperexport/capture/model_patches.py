"""Which library patches and registrations an export needs, entered around capture and export."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


def _from_transformers(model: torch.nn.Module) -> bool:
    return any(type(m).__module__.startswith("transformers.") for m in (model, *model.children()))


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
            from hyperexport.transformers.patches import export_patches

            stack.enter_context(export_patches(dynamo))
        if attention is not None:
            from hyperexport.transformers.attention import attention_export_context

            table = stack.enter_context(attention_export_context(attention, dynamo, model))
        yield table
