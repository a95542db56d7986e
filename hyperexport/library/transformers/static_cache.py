"""KV caches for export: explicit past/present tensors, and a fixed-size tensor cache.

:class:`ExplicitKVCacheModel` wraps a transformers decoder (``LlamaModel``-like, or a
``...ForCausalLM``) so that its forward takes and returns plain tensors only:

    (input_ids, attention_mask, position_ids, past_key_0, past_value_0, ...)
        -> (hidden_states or logits, present_key_0, present_value_0, ...)

``past_*`` are ``(batch, kv_heads, past_len, head_dim)``; ``present_*`` have ``past_len +
new_len`` positions (the cache is updated by concatenation, as transformers' ``DynamicCache``
does). Prefill is the same graph with ``past_len = 0``. Inside a decoder-layer function the
layer's past/present become that function's inputs/outputs, so the function serves generation.
This is the concatenating (growing) layout that ONNX Runtime GenAI-style loops use.

:class:`StaticCache` is the fixed-size layout: one tensor ``(layers, 2, batch, kv_heads,
max_cache_len, head_dim)`` that *is* the cache object (a ``torch.Tensor`` subclass with
transformers' ``Cache`` API), updated by scatter (``index_copy``) at the new positions. Being a
tensor, it crosses every function boundary: ``hiera=[LlamaAttention, LlamaDecoderLayer]`` on a
model run with it exports each layer with the cache as an input (see :class:`StaticCache`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hyperexport.base.versions import torch_compiler_flags
from hyperexport.library.public import set_module


def size_of(count: torch.Tensor, at_most: int) -> int:
    """The integer in 0-d ``count`` as a size: a plain int eagerly, an unbacked size (bounded by
    ``0 <= size <= at_most``) under ``torch.export``, where ``int(count)`` would fail on a
    data-dependent value."""
    size = count.item()
    torch._check(size >= 0)
    torch._check(size <= at_most)
    return size  # type: ignore[return-value]


@set_module("hyperexport.transformers.static_cache")
class ExplicitKVCacheModel(nn.Module):
    """A transformers decoder with its KV cache as explicit tensor inputs and outputs.

    Args:
        model: A transformers decoder model (base model or causal LM).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        self.config = config
        self.num_layers = int(config.num_hidden_layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Run one step (prefill or decode) and return the output and the updated cache."""
        from transformers import DynamicCache

        if len(past) != 2 * self.num_layers:
            raise ValueError(f"expected {2 * self.num_layers} past tensors, got {len(past)}")
        cache = DynamicCache(config=self.config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        main = output.logits if hasattr(output, "logits") else output.last_hidden_state
        presents: list[torch.Tensor] = []
        layers: list[Any] = list(cache.layers)
        for layer in layers:
            presents.extend((layer.keys, layer.values))
        return (main, *presents)

    def io_names(self) -> tuple[list[str], list[str]]:
        """Input and output names for ``torch.onnx.export``."""
        pasts = [f"past_{kind}_{i}" for i in range(self.num_layers) for kind in ("key", "value")]
        presents = [p.replace("past_", "present_") for p in pasts]
        return ["input_ids", "attention_mask", "position_ids", *pasts], ["output", *presents]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """``dynamic_axes`` for the TorchScript path: batch, new length, past and total length."""
        inputs, outputs = self.io_names()
        axes: dict[str, dict[int, str]] = {
            "input_ids": {0: "batch", 1: "new_len"},
            "attention_mask": {0: "batch", 1: "total_len"},
            "position_ids": {0: "batch", 1: "new_len"},
            outputs[0]: {0: "batch", 1: "new_len"},
        }
        for name in inputs[3:]:
            axes[name] = {0: "batch", 2: "past_len"}
        for name in outputs[1:]:
            axes[name] = {0: "batch", 2: "total_len"}
        return axes

    def empty_past(self, batch: int) -> list[torch.Tensor]:
        """Zero-length past tensors for a prefill step."""
        config = self.config
        heads = int(getattr(config, "num_key_value_heads", config.num_attention_heads))
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        dtype = next(self.model.parameters()).dtype
        return [torch.zeros(batch, heads, 0, head_dim, dtype=dtype)] * (2 * self.num_layers)


def _torch_exporting() -> bool:
    """Whether ``torch.export`` is tracing right now: ``torch.compiler.is_exporting()``; before
    torch 2.7, ``torch.compiler.is_compiling()``, which ``torch.export`` sets too (hyperexport
    compiles only through it); False on torch 2.2, which has neither and where the dynamo path
    is refused (``versions.TORCH_COMPILER_HAS_IS_EXPORTING``)."""
    has_is_exporting, has_is_compiling = torch_compiler_flags()
    if has_is_exporting:
        return bool(torch.compiler.is_exporting())
    if has_is_compiling:
        return bool(torch.compiler.is_compiling())
    return False


def _exporting() -> bool:
    """Whether an ONNX export (either path) or ``torch.export`` is tracing right now."""
    return bool(torch.onnx.is_in_onnx_export() or _torch_exporting())


class _FixedCacheAPI:
    """transformers' ``Cache`` API over one ``(layers, 2, batch, heads, len, dim)`` tensor."""

    @property
    def _kv(self) -> torch.Tensor:
        """The cache as a plain tensor."""
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self._kv.shape[0])

    @property
    def max_batch_size(self) -> int:
        return int(self._kv.shape[2])

    @property
    def max_cache_len(self) -> int:
        return int(self._kv.shape[4])

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self)

    @property
    def is_linear(self) -> list[bool]:
        return [False] * len(self)

    @property
    def is_dummy(self) -> list[bool]:
        return [False] * len(self)

    def early_initialization(
        self,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        max_cache_len: int = 2048,
    ) -> StaticCache:
        """A zero cache with this one's layer count and the given sizes."""
        shape = (len(self), 2, batch_size, num_heads, max_cache_len, head_dim)
        kv = self._kv
        zeros = torch.zeros(shape, dtype=dtype or kv.dtype, device=device or kv.device)
        return zeros.as_subclass(StaticCache)

    def _written(self, layer_idx: int) -> torch.Tensor:
        """``(max_len,)`` booleans: positions of ``layer_idx`` whose key is not all zeros."""
        keys = self._kv[layer_idx, 0]
        return (keys != 0).flatten(0, 1).any(dim=0).any(dim=-1)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """How many positions of ``layer_idx`` hold keys (0 for a layer beyond the cache)."""
        if layer_idx >= len(self):
            return 0
        # An unbacked size under torch.export (transformers 4.57 builds cache_position from it).
        return size_of(self._written(layer_idx).sum(), self.max_cache_len)

    def get_query_offset(self, layer_idx: int | None = 0) -> torch.Tensor:
        """Position of the first new token: the written length, as a tensor (no graph break)."""
        layer = layer_idx or 0
        if layer >= len(self):
            return torch.zeros((), dtype=torch.int64, device=self._kv.device)
        return self._written(layer).sum()

    def get_mask_sizes(self, query: Any, layer_idx: int = 0) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: the whole fixed length; a layer beyond: the query's."""
        if layer_idx >= len(self):
            if isinstance(query, torch.Tensor):
                return (int(query.shape[0]) if query.ndim > 0 else int(query)), 0
            return int(query), 0
        return self.max_cache_len, 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_cache_len if layer_idx < len(self) else -1

    def get_max_length(self) -> int:
        return self.max_cache_len

    def _positions(self, new: int, layer_idx: int, cache_kwargs: Any, kwargs: Any) -> torch.Tensor:
        for source in (cache_kwargs, kwargs):
            if isinstance(source, dict):
                position = source.get("cache_position")
                if position is not None:
                    return position.to(torch.int64).reshape(-1)
                ids = source.get("position_ids")
                if ids is not None and ids.shape[-1] == new:
                    return ids.to(torch.int64).reshape(-1, new)[0]
        return torch.arange(new, device=self._kv.device) + self.get_query_offset(layer_idx)

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
        *,
        kwargs: dict[str, Any] | None = None,
        **extra: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states``/``value_states`` of layer ``layer_idx`` at their positions.

        Positions come from ``cache_position`` (older transformers), else the layer's
        ``position_ids``, else follow the written length. Returns the layer's whole keys and
        values.
        """
        positions = self._positions(int(key_states.shape[-2]), layer_idx, cache_kwargs, kwargs)
        plain = self._kv
        keys, values = plain[layer_idx, 0], plain[layer_idx, 1]
        if _exporting():
            keys, values = keys.clone(), values.clone()  # the graph must not mutate its input
        try:
            keys.index_copy_(2, positions, key_states)
            values.index_copy_(2, positions, value_states)
        except NotImplementedError:  # devices without index_copy_
            keys[:, :, positions] = key_states
            values[:, :, positions] = value_states
        return keys, values

    def reset(self) -> None:
        self._kv.zero_()

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Reorder the batch (beam) axis in place, as transformers' caches do; empty: no-op."""
        if self.get_seq_length() == 0:
            return
        plain = self._kv
        plain.copy_(plain.index_select(2, beam_idx.to(plain.device)))

    def crop(self, max_length: int) -> None:
        """Nothing to do: the cache is fixed-size (positions beyond stay masked)."""

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Not supported by a fixed-size cache; a no-op as in HyperONNX."""

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Not supported by a fixed-size cache; a no-op as in HyperONNX."""


@set_module("hyperexport.transformers.static_cache")
class StaticCache(_FixedCacheAPI, torch.Tensor):
    """A fixed-size KV cache that is a tensor: ``(layers, 2, batch, kv_heads, max_len, head_dim)``.

    Index ``[layer, 0]`` holds keys and ``[layer, 1]`` values. It implements the parts of
    transformers' ``Cache`` API that models and mask creation call (``update``,
    ``get_seq_length``, ``get_mask_sizes``, ``get_query_offset``, ``get_max_cache_shape``,
    ``reorder_cache``, ``reset``, ``early_initialization``, ``is_sliding``...), for transformers
    releases that pass ``cache_position`` and for those that pass ``position_ids``.

    ``update`` writes the new keys/values at their positions and returns the whole layer
    (``max_len`` positions; the mask hides the unwritten ones). Eagerly it writes in place; while
    an ONNX export runs it writes into a copy, so the exported graph never mutates its input
    (the graph reads the cache, each layer attends over its own updated slice).

    A position counts as written when its key is not all zeros (``get_seq_length``), as in
    HyperONNX. Make one with ``torch.zeros(shape).as_subclass(StaticCache)`` or
    :meth:`early_initialization`.

    In a unit's export the cache is rebuilt from the traced tensor by :meth:`from_export_tensor`
    as a :class:`StaticCacheView` (same API, not a subclass), which ``torch.export`` can trace.
    """

    @property
    def _kv(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)

    @classmethod
    def from_export_tensor(cls, tensor: torch.Tensor) -> StaticCache | StaticCacheView:
        """The cache an exported unit receives for the traced ``tensor``.

        The TorchScript tracer takes the subclass itself; ``torch.export`` cannot make a plain
        subclass of its fake tensors, so there the unit gets a :class:`StaticCacheView`.
        """
        if _torch_exporting():
            return StaticCacheView(tensor)
        return tensor.as_subclass(cls)


@set_module("hyperexport.transformers.static_cache")
@dataclass
class StaticCacheView(_FixedCacheAPI):
    """:class:`StaticCache`'s API over a plain tensor (what an exported unit sees)."""

    data: torch.Tensor

    @property
    def _kv(self) -> torch.Tensor:
        return self.data

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.data[index]
