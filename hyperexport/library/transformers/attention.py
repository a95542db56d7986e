"""transformers' ``AttentionInterface`` entry for ``hyperexport::attention``, and its scoped use.

:func:`attention_export_context` is the one entry point for exporters::

    with attention_export_context("hyperexport", dynamo=True, model=model) as table:
        torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table)

Inside it, every transformers model whose attention goes through ``ALL_ATTENTION_FUNCTIONS``
(Llama, Qwen2/3, GPT-2, Mistral, Gemma, ...) calls the custom op, which exports as one
``hyperexport.attention::Attention`` node per call; GQA stays a head broadcast (no ``repeat_kv``
in the graph). Nothing is registered on import, and everything is restored on exit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from hyperexport.base.contracts.names import BUILTIN_ATTENTION, HYPEREXPORT_ATTENTION
from hyperexport.base.errors import HyperExportError
from hyperexport.base.versions import attention_switched_by_config
from hyperexport.library.transformers.attention_onnx import (
    attention_translation_table,
    torchscript_attention_symbolic,
)
from hyperexport.library.transformers.attention_op import attention

log = logging.getLogger(__name__)

DEFAULT_IMPLEMENTATION = HYPEREXPORT_ATTENTION


def hyperexport_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` function: transformers' call convention over the custom op.

    Args:
        module: The attention module (read for ``is_causal``).
        query: ``(batch, q_heads, q_len, head_dim)``.
        key: ``(batch, kv_heads, kv_len, head_dim)``.
        value: ``(batch, kv_heads, kv_len, v_dim)``.
        attention_mask: The model's 4-D mask (boolean from the sdpa mask function), or None.
        dropout: Must be 0 unless the module is in eval mode (dropout is not exported).
        scaling: Factor on ``Q @ K^T``; None for ``1 / sqrt(head_dim)``.
        is_causal: Overrides ``module.is_causal`` when given.
        **kwargs: ``softcap`` is honoured; ``s_aux`` (attention sinks) is refused.

    Returns:
        ``(output of shape (batch, q_len, q_heads, v_dim), None)``.
    """
    if kwargs.get("s_aux") is not None:
        raise HyperExportError("hyperexport attention does not support attention sinks (s_aux)")
    if dropout and module.training:
        raise HyperExportError("hyperexport attention does not implement dropout; use eval mode")
    global _calls
    _calls += 1
    declared = is_causal if is_causal is not None else getattr(module, "is_causal", None)
    causal = declared if declared is not None else True
    # As in transformers' sdpa path: the mask, when present, already encodes causality, and a
    # single query token attends every cached key.
    use_causal = attention_mask is None and bool(causal) and int(query.shape[2]) > 1
    if attention_mask is not None and attention_mask.shape[-1] > key.shape[-2]:
        # as transformers' own attention functions do: before masking_utils, a 4.x model given
        # no attention mask builds one a key longer than the keys (past + length + 1; GPT-2 on
        # 4.53). Where the lengths agree (every model from masking_utils on) nothing is traced.
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    output = attention(
        query,
        key,
        value,
        attention_mask,
        is_causal=use_causal,
        scale=scaling,
        softcap=kwargs.get("softcap"),
        # The module says it is causal (a decoder's self-attention): recorded for the fusion
        # into ONNX Runtime's always-causal GroupQueryAttention; unknown is not causal.
        causal_hint=_declared_causal(module, is_causal) and not use_causal,
    )
    return output.transpose(1, 2).contiguous(), None


def _declared_causal(module: torch.nn.Module, is_causal: bool | None) -> bool:
    """Whether the module is a causal self-attention, whatever this call's ``is_causal`` says.

    A call's ``is_causal`` may only say whether the mask is left to the kernel: GPT-2 in
    transformers 4.x passes ``is_causal=False`` whenever a mask is given, while the module's
    ``is_causal`` stays True (for its cross-attention too, which ``is_cross_attention`` tells).
    """
    if is_causal:
        return True
    if getattr(module, "is_cross_attention", False):
        return False
    return bool(getattr(module, "is_causal", False))


_calls = 0


def attention_calls() -> int:
    """How many calls reached :func:`hyperexport_attention_forward` in this process so far."""
    return _calls


_lock = threading.Lock()
_depth: dict[str, int] = {}
_previous: dict[str, tuple[Any, Any]] = {}


@contextmanager
def registered_attention(implementation: str = DEFAULT_IMPLEMENTATION) -> Iterator[str]:
    """Register :func:`hyperexport_attention_forward` in transformers under ``implementation``.

    Registers the attention function in ``AttentionInterface`` and transformers' sdpa mask
    function in ``AttentionMaskInterface`` (without a mask entry transformers would build no mask
    at all). Re-entrant per name; the outermost exit restores whatever was registered before.

    Args:
        implementation: The name models select with ``set_attn_implementation``.

    Yields:
        The registered name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if implementation in BUILTIN_ATTENTION:
        raise HyperExportError(
            f"attention implementation {implementation!r} is a transformers built-in; "
            "register hyperexport attention under its own name"
        )
    attention_map = AttentionInterface._global_mapping
    mask_map = AttentionMaskInterface._global_mapping
    with _lock:
        if _depth.get(implementation, 0) == 0:
            _previous[implementation] = (
                attention_map.get(implementation),
                mask_map.get(implementation),
            )
            AttentionInterface.register(implementation, hyperexport_attention_forward)
            AttentionMaskInterface.register(implementation, sdpa_mask)
            log.debug("registered transformers attention %r", implementation)
        _depth[implementation] = _depth.get(implementation, 0) + 1
    try:
        yield implementation
    finally:
        with _lock:
            _depth[implementation] -= 1
            if _depth[implementation] == 0:
                old_attention, old_mask = _previous.pop(implementation)
                _restore(attention_map, implementation, old_attention)
                _restore(mask_map, implementation, old_mask)
                log.debug("unregistered transformers attention %r", implementation)


def _restore(mapping: dict[str, Any], name: str, previous: Any) -> None:
    if previous is None:
        mapping.pop(name, None)
    else:
        mapping[name] = previous


@contextmanager
def model_attention_implementation(model: torch.nn.Module, implementation: str) -> Iterator[None]:
    """Switch a transformers model's attention implementation; switch it back on exit.

    ``model`` may also wrap one (the generation task's step module holds the ``*ForCausalLM``):
    the outermost submodule that is a transformers model is switched.
    """
    by_config = attention_switched_by_config()
    switchable: Any = next((m for m in model.modules() if _settable(m, by_config)), None)
    if switchable is None:
        raise HyperExportError(
            f"{type(model).__name__} is not a transformers model with a settable attention "
            "implementation"
        )
    original = switchable.config._attn_implementation
    if original == implementation:
        yield
        return
    switch = _by_config(switchable) if by_config else switchable.set_attn_implementation
    switch(implementation)
    log.debug(
        "set %s attention implementation %r -> %r",
        type(switchable).__name__,
        original,
        implementation,
    )
    try:
        yield
    finally:
        switch(original)


def _settable(module: torch.nn.Module, by_config: bool) -> bool:
    config = getattr(module, "config", None)
    has_implementation = getattr(config, "_attn_implementation", None) is not None
    if by_config:  # a transformers model, before set_attn_implementation
        from transformers import PreTrainedModel

        return has_implementation and isinstance(module, PreTrainedModel)
    return has_implementation and hasattr(module, "set_attn_implementation")


def _by_config(model: Any) -> Callable[[str], None]:
    """Switch ``model``'s attention through its config (the releases of
    :data:`~hyperexport.base.versions.TRANSFORMERS_SET_ATTN_IMPLEMENTATION` lack the method)."""

    def switch(implementation: str) -> None:
        model.config._attn_implementation = implementation

    return switch


@contextmanager
def attention_export_context(
    implementation: str = DEFAULT_IMPLEMENTATION,
    dynamo: bool = False,
    model: torch.nn.Module | None = None,
) -> Iterator[dict[Any, Callable[..., Any]]]:
    """Everything an export needs for attention to come out as one custom node per call.

    Registers the transformers attention (and mask) entry, the TorchScript symbolic when
    ``dynamo`` is False, and switches ``model`` (when given) to ``implementation``. All of it is
    undone on exit, in reverse order.

    Args:
        implementation: Name of the transformers attention entry.
        dynamo: The export path.
        model: A transformers ``PreTrainedModel`` to switch, or None to leave models alone (e.g.
            when the model was built with ``attn_implementation=implementation`` inside the
            context).

    Yields:
        The ``custom_translation_table`` to pass to ``torch.onnx.export(..., dynamo=True)``;
        empty for the TorchScript path.
    """
    with ExitStack() as stack:
        stack.enter_context(registered_attention(implementation))
        if not dynamo:
            stack.enter_context(torchscript_attention_symbolic())
        if model is not None:
            stack.enter_context(model_attention_implementation(model, implementation))
        yield attention_translation_table() if dynamo else {}
