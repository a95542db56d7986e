"""Decoder-layer functions usable for generation: past and present KV as explicit tensors.

A transformers decoder layer takes the model's whole ``Cache`` object and updates it in place,
which no function boundary can carry. :func:`explicit_kv_layers` swaps each layer, for the
duration of an export, for a :class:`KVCacheLayer` that reads the layer's past keys/values out
of the cache, calls :class:`KVStep` — a module whose forward takes and returns tensors only —
and writes the present keys/values back. With ``hiera=[KVStep]`` each step becomes a function

    (hidden_states, attention_mask, cos, sin, position_ids, past_key, past_value)
        -> (hidden_states, present_key, present_value)

that a generation loop can call. The hidden states come back as the layer returned them: a tensor,
or a one-tensor tuple where the layer returns a tuple (transformers 4.57's Gemma2 and others, whose
stack takes ``[0]``, while its Llama returns the tensor). Being the step's output structure, it is
recorded at capture and rebuilt where the step is a function, so :class:`KVCacheLayer` returns what
the layer it stands for would, on any release, without asking which. Inside a step the layer sees a one-layer cache at index 0 (its
``layer_idx`` is set to 0 for the call), so all steps of one structure share a per-type body.

Works for decoders whose layers are called like Llama's (Llama, Qwen2/3, Mistral, ...). Use it
together with :class:`~hyperexport.library.transformers.static_cache.ExplicitKVCacheModel`, which
makes the model's own inputs and outputs tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from hyperexport.base.versions import cache_keyword
from hyperexport.library.public import set_module

#: The module a layer is swapped for.
Wrapped = TypeVar("Wrapped", bound=nn.Module)


@set_module("hyperexport.transformers.kv_layers")
class KVStep(nn.Module):
    """One decoder layer as a tensor-only step; the unit that becomes a function."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position_ids: torch.Tensor | None,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor | tuple[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Run the layer on a one-layer cache holding ``past_key``/``past_value``.

        Returns:
            The hidden states (a tensor, or ``(tensor,)`` if the layer returns a tuple), the
            present keys and the present values.
        """
        from transformers import DynamicCache

        cache = DynamicCache()
        cache.update(past_key, past_value, 0)
        with layer_index_zero(self.layer):
            out = self.layer(
                hidden_states,
                attention_mask=attention_mask,
                position_embeddings=(cos, sin),
                position_ids=position_ids,
                use_cache=True,
                **{cache_keyword(): cache},
            )
        # Only the hidden states: the layer's other outputs (attention weights) are not asked for.
        hidden = (out[0],) if isinstance(out, tuple) else out
        present: Any = cache.layers[0]
        return hidden, present.keys, present.values


@set_module("hyperexport.transformers.kv_layers")
class KVCacheLayer(nn.Module):
    """Stands where the decoder layer was: moves its past/present between cache and step."""

    def __init__(self, layer: nn.Module, index: int) -> None:
        super().__init__()
        self.step = KVStep(layer)
        self.index = index
        # Models that pick each layer's mask by its kind (full or sliding attention) read it off
        # the layer in their loop (transformers 4.57: ``decoder_layer.attention_type``).
        if isinstance(kind := getattr(layer, "attention_type", None), str):
            self.attention_type = kind

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor | tuple[torch.Tensor]:
        """Same call convention as a Llama decoder layer, and the layer's own kind of result (see
        :class:`KVStep`); the cache is updated in place."""
        cache = kwargs.get(cache_keyword())
        if cache is None or position_embeddings is None:
            raise ValueError("KVCacheLayer needs the model's cache and position embeddings")
        layer = cache.layers[self.index]
        hidden, key, value = self.step(
            hidden_states,
            attention_mask,
            position_embeddings[0],
            position_embeddings[1],
            position_ids,
            layer.keys,
            layer.values,
        )
        layer.keys, layer.values = key, value
        return hidden


@contextlib.contextmanager
def layer_index_zero(layer: nn.Module) -> Iterator[None]:
    """Give every submodule of ``layer`` that has a ``layer_idx`` the index 0 while inside, so
    that the layer reads and writes a one-layer cache; the real indices come back on exit."""
    # Read through vars(): hyperexport records the attributes a forward reads (to prove per-type
    # reuse safe), and the real index, read here, must not count as read by the step.
    modules = [m for m in layer.modules() if isinstance(vars(m).get("layer_idx"), int)]
    saved = [vars(m)["layer_idx"] for m in modules]
    try:
        for m in modules:
            setattr(m, "layer_idx", 0)  # noqa: B010 (nn.Module typing)
        yield
    finally:
        for m, index in zip(modules, saved):
            setattr(m, "layer_idx", index)  # noqa: B010


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no decoder layer list (.layers)")
    return layers


@contextlib.contextmanager
def swapped_layers(
    layers: nn.ModuleList, wrap: Callable[[nn.Module, int], Wrapped]
) -> Iterator[list[Wrapped]]:
    """Put ``wrap(layer, index)`` in place of every layer of ``layers``; the originals come back
    on exit, whatever happened inside."""
    originals = list(layers)
    wrapped = [wrap(layer, i) for i, layer in enumerate(originals)]
    try:
        for i, layer in enumerate(wrapped):
            layers[i] = layer
        yield wrapped
    finally:
        for i, original in enumerate(originals):
            layers[i] = original


@contextlib.contextmanager
def explicit_kv_layers(model: nn.Module) -> Iterator[list[KVCacheLayer]]:
    """Swap every decoder layer for a :class:`KVCacheLayer`; put the originals back on exit."""
    with swapped_layers(_decoder_layers(model), KVCacheLayer) as wrapped:
        yield wrapped
