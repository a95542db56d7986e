"""Encoder-decoder layers as functions with their self- and cross-attention KV explicit.

A transformers seq2seq decoder layer takes the model's whole ``EncoderDecoderCache`` and updates
it in place, which no function boundary can carry. :func:`explicit_seq2seq_layers` swaps each
decoder layer, for the duration of an export, for a :class:`Seq2SeqCacheLayer` that reads the
layer's past self-attention keys/values and its cross-attention keys/values out of the cache,
calls :class:`Seq2SeqKVStep` — a module whose forward takes and returns tensors only — and
writes the present self-attention keys/values back. With ``hiera=[Seq2SeqKVStep]`` each step is
a function

    (past_key, past_value, cross_key, cross_value, *layer tensors) -> (*layer outputs, present_key,
    present_value)

Inside a step the layer sees a one-layer cache at index 0 whose cross-attention entry is marked
computed, so the layer reads the cross KV instead of projecting the encoder's states.

:class:`CrossKV` is the other half: the cross-attention keys/values of one decoder layer computed
from the encoder's states (the layer's own projections, run through its attention module with a
throw-away one-token query whose result is discarded), so the encoder graph can output them.

Checked with the layers of T5, BART, mBART and Whisper (their cross-attention module is
``encoder_attn`` or ``layer[1].EncDecAttention``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from hyperexport.base.versions import cache_keyword, layers_return_tuples, query_position_arguments
from hyperexport.library.public import set_module
from hyperexport.library.transformers.kv_layers import layer_index_zero, swapped_layers

#: Attribute paths of a decoder layer's cross-attention module, per family.
CROSS_ATTENTION_PATHS = ("encoder_attn", "layer.1.EncDecAttention")
#: Attribute names of a stack's layer list (``layers``: BART-like, ``block``: T5).
LAYER_LISTS = ("layers", "block")


def _one_layer_cache(
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    cross_key: torch.Tensor | None = None,
    cross_value: torch.Tensor | None = None,
) -> Any:
    from transformers import DynamicCache, EncoderDecoderCache

    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    if past_key is not None and past_value is not None:
        cache.self_attention_cache.update(past_key, past_value, 0)
    if cross_key is not None and cross_value is not None:
        cache.cross_attention_cache.update(cross_key, cross_value, 0)
        cache.is_updated[0] = True
    return cache


@set_module("hyperexport.transformers.seq2seq_layers")
class Seq2SeqKVStep(nn.Module):
    """One decoder layer as a tensor-only step; the unit that becomes a function.

    ``names`` (the layer's tensor arguments, in order), ``static`` (its other arguments, as
    JSON) and
    ``none_outputs`` (which of its outputs are None) are set by :class:`Seq2SeqCacheLayer` for
    each call; they are the same for every call of one layer. So is ``returns_tuple``: whether
    the layer returns a tuple (transformers 4.57's layers do, even of one tensor, and their
    stack takes ``[0]``) or its tensor (5.x); None until the layer ran (then
    :func:`~hyperexport.base.versions.layers_return_tuples` decides).
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.names: tuple[str, ...] = ()
        # JSON text, not a dict: per-type sharing compares the values a forward reads, and a
        # container is compared by identity, a string by value.
        self.static = "{}"
        self.none_outputs: tuple[bool, ...] = ()
        self.returns_tuple: bool | None = None

    def forward(
        self,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
        cross_key: torch.Tensor,
        cross_value: torch.Tensor,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Run the layer on a one-layer cache; return its tensor outputs and the present KV."""
        cache = _one_layer_cache(past_key, past_value, cross_key, cross_value)
        kwargs = dict(zip(self.names, tensors))
        with layer_index_zero(self.layer):
            out = self.layer(**kwargs, **json.loads(self.static), **{cache_keyword(): cache})
        self.returns_tuple = isinstance(out, tuple)
        outs = out if self.returns_tuple else (out,)
        self.none_outputs = tuple(o is None for o in outs)
        present: Any = cache.self_attention_cache.layers[0]
        return (*[o for o in outs if o is not None], present.keys, present.values)


@set_module("hyperexport.transformers.seq2seq_layers")
class Seq2SeqCacheLayer(nn.Module):
    """Stands where the decoder layer was: moves its KV between the model's cache and the step."""

    def __init__(self, layer: nn.Module, index: int) -> None:
        super().__init__()
        self.step = Seq2SeqKVStep(layer)
        self.index = index
        self._signature = inspect.signature(layer.forward)
        self._single = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's own call convention; the cache's entries of this layer are updated."""
        cache = kwargs.pop(cache_keyword(), None)
        if cache is None or not hasattr(cache, "cross_attention_cache"):
            raise ValueError("Seq2SeqCacheLayer needs the model's EncoderDecoderCache")
        kwargs.pop("past_key_values", None)
        bound = self._signature.bind_partial(*args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.update(arguments.pop("kwargs", None) or {})
        tensors = {k: v for k, v in arguments.items() if isinstance(v, torch.Tensor)}
        static = {k: v for k, v in arguments.items() if k not in tensors and v is not None}
        try:
            self.step.static = json.dumps(static, sort_keys=True)
        except TypeError as e:
            raise TypeError(
                f"{type(self.step.layer).__name__} is called with a non-tensor argument that is "
                f"not a constant ({', '.join(sorted(static))}): {e}"
            ) from e
        self.step.names = tuple(tensors)
        own = cache.self_attention_cache.layers[self.index]
        cross = cache.cross_attention_cache.layers[self.index]
        outs = self.step(own.keys, own.values, cross.keys, cross.values, *tensors.values())
        *results, own.keys, own.values = outs
        # Which outputs were None is known once the layer ran; a step replaced by its function
        # during the export did not run: then none were (a decoder layer given encoder states).
        none = self.step.none_outputs or (False,) * len(results)
        it = iter(results)
        full = tuple(None if n else next(it) for n in none)
        returns_tuple = self.step.returns_tuple
        if returns_tuple is None:  # the step did not run here (see above)
            returns_tuple = len(full) > 1 or layers_return_tuples()
        return full if returns_tuple else full[0]


@set_module("hyperexport.transformers.seq2seq_layers")
class CrossKV(nn.Module):
    """The cross-attention keys/values one decoder layer reads, from the encoder's states."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, encoder_hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key, value)``: the attention module's own projections of the encoder's states."""
        cache = _one_layer_cache(None, None)
        query = encoder_hidden_states[:, :1]  # a throw-away query: only the cache is kept
        with layer_index_zero(self.attention):
            self.attention(
                query,
                key_value_states=encoder_hidden_states,
                **{cache_keyword(): cache},
                **query_position_arguments(self.attention, 1),
            )
        layer: Any = cache.cross_attention_cache.layers[0]
        return layer.keys, layer.values


def stack_layers(stack: nn.Module) -> nn.ModuleList:
    """The layer list of an encoder or decoder stack (``layers`` or ``block``)."""
    for name in LAYER_LISTS:
        layers = getattr(stack, name, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise TypeError(f"{type(stack).__name__} has no layer list ({', '.join(LAYER_LISTS)})")


def cross_attention(layer: nn.Module) -> nn.Module:
    """The decoder layer's cross-attention module."""
    names = dict(layer.named_modules())
    for path in CROSS_ATTENTION_PATHS:
        if path in names:
            return names[path]
    raise TypeError(
        f"{type(layer).__name__} has no cross-attention module ({', '.join(CROSS_ATTENTION_PATHS)})"
    )


@contextlib.contextmanager
def explicit_seq2seq_layers(model: nn.Module) -> Iterator[list[Seq2SeqCacheLayer]]:
    """Swap every decoder layer for a :class:`Seq2SeqCacheLayer`; put the originals back on exit."""
    layers = stack_layers(model.get_decoder())  # type: ignore[operator]
    with swapped_layers(layers, Seq2SeqCacheLayer) as wrapped:
        yield wrapped
