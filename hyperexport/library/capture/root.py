"""The root model's own class in ``hiera``: the whole model becomes the outermost function.

Forward hooks see only calls of submodules, and the export's main graph *is* the root's body, so
a root class listed in ``hiera`` would match nothing. :func:`root_as_function` puts the model
under a thin holder module instead: the model is then a submodule called once, its call becomes
one function, and the main graph is a single call of it. Module paths inside gain the prefix
``root.``; the graph's input names are unchanged (the holder's forward has the model's
signature).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch

from hyperexport.library.public import set_module

log = logging.getLogger(__name__)


@set_module("hyperexport.capture.root")
class RootHolder(torch.nn.Module):
    """Holds ``model`` as its only child and calls it with the model's own signature."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.root = model
        self.train(model.training)

        @functools.wraps(model.forward)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self.root(*args, **kwargs)

        # An instance attribute: inspect.signature follows __wrapped__ to the model's forward,
        # so binding and input names are the model's.
        self.forward = forward


def root_as_function(model: torch.nn.Module, hiera: Sequence[type], method: str) -> torch.nn.Module:
    """``model`` itself, or a :class:`RootHolder` of it when its class is in ``hiera``.

    Args:
        model: The root module.
        hiera: Resolved hiera classes.
        method: The method being exported; only ``forward`` goes through the module's call (and
            its hooks), so for another method the root class is left out, with a WARNING.

    Returns:
        The module to capture and export.
    """
    if not any(isinstance(model, cls) for cls in hiera):
        return model
    if method != "forward":
        log.warning(
            "hiera lists the root class %s, but method %r is exported, not forward: the root "
            "stays the main graph",
            type(model).__name__,
            method,
        )
        return model
    log.info("hiera lists the root class %s: the model becomes one function", type(model).__name__)
    return RootHolder(model)
