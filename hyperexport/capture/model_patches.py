"""Which library patches an export of a given model needs, entered around capture and export."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _from_transformers(model: torch.nn.Module) -> bool:
    return any(type(m).__module__.startswith("transformers.") for m in (model, *model.children()))


@contextlib.contextmanager
def export_context(model: torch.nn.Module, dynamo: bool) -> Iterator[None]:
    """Enter hyperexport's transformers patches when ``model`` comes from transformers.

    The same patches must be active during capture and export, so that both see the same
    module inputs (mask creation is one of the patched places).
    """
    if not _from_transformers(model):
        yield
        return
    from hyperexport.transformers.patches import export_patches

    with export_patches(dynamo):
        yield
