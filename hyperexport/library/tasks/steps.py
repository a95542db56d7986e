"""The modules each task's graphs are traced and exported from: every KV cache as explicit
tensors (torch; the trace and export stages only).

:class:`CausalLMStep` (``task: text-generation``) wraps a transformers ``*ForCausalLM``: its
forward takes ``input_ids``, ``attention_mask``, ``position_ids`` and one
``past_key_values.<i>.key/value`` tensor per layer (as ``past_key_values={"<i>": {"key": ...,
"value": ...}}``, whose capture leaf names are the dotted names;
:func:`~hyperexport.library.models.inputs.make_inputs` nests dotted input names so), and returns
``logits`` and ``present.<i>.key/value``. Run it inside
:func:`hyperexport.library.transformers.kv_layers.explicit_kv_layers` with ``hiera=[KVStep]``: each
decoder layer is then a function with past and present KV as its inputs and outputs.

The encoder-decoders' two graphs: :class:`TextEncoderStep` and :class:`SpeechEncoderStep` run
the encoder once and project each decoder layer's cross-attention keys/values from its states
(:class:`~hyperexport.library.transformers.seq2seq_layers.CrossKV`):

    input_ids, attention_mask          (text)   -> last_hidden_state, present.<i>.encoder.key/value
    input_features                     (speech)

:class:`DecoderStep` is one decoder step with every KV explicit, for any past length (0 on the
first step):

    input_ids, [encoder_attention_mask], past_key_values.<i>.decoder.key/value,
    past_key_values.<i>.encoder.key/value   -> logits, present.<i>.decoder.key/value

The cross KV are computed once by the encoder graph and fed unchanged to every decoder step, so
the decoder has no branch and no encoder states input. Names follow Optimum's. Run the decoder
inside :func:`~hyperexport.library.transformers.seq2seq_layers.explicit_seq2seq_layers` with
``hiera=[Seq2SeqKVStep]``: each decoder layer is then a function with its KV as inputs/outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hyperexport.base.versions import cache_keyword
from hyperexport.library.public import set_module
from hyperexport.library.transformers.seq2seq_layers import CrossKV, cross_attention, stack_layers


@set_module("hyperexport.tasks.steps")
class CausalLMStep(nn.Module):
    """One prefill or decode step of a causal LM, with its cache as explicit tensors.

    Args:
        model: A transformers ``*ForCausalLM`` whose ``config`` has ``num_hidden_layers``.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        self.num_layers = int(config.num_hidden_layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: dict[str, dict[str, torch.Tensor]],
    ) -> dict[str, Any]:
        """Logits of the new tokens and each layer's present keys/values (past + new)."""
        from transformers import DynamicCache

        # A cache of full layers whatever the config says: a sliding-window layer would crop
        # its keys, and onnxruntime-genai (past_present_share_buffer off) expects the present
        # to be the past plus the new tokens. The window is applied by the mask.
        cache = DynamicCache()
        for layer in range(self.num_layers):
            kv = past_key_values[str(layer)]
            cache.update(kv["key"], kv["value"], layer)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{cache_keyword(): cache},
        )
        layers: list[Any] = list(cache.layers)
        present: dict[str, dict[str, torch.Tensor]] = {}
        for i, layer in enumerate(layers):
            present[str(i)] = {"key": layer.keys, "value": layer.values}
        return {"logits": output.logits, "present": present}


def _cross_modules(model: nn.Module) -> nn.ModuleList:
    decoder: Any = model.get_decoder()  # type: ignore[operator]
    return nn.ModuleList(CrossKV(cross_attention(layer)) for layer in stack_layers(decoder))


def _cross_outputs(cross: nn.ModuleList, states: torch.Tensor) -> dict[str, Any]:
    present: dict[str, Any] = {}
    for i, module in enumerate(cross):
        key, value = module(states)
        present[str(i)] = {"encoder": {"key": key, "value": value}}
    return present


@set_module("hyperexport.tasks.steps")
class TextEncoderStep(nn.Module):
    """The encoder graph of a text model: states and every decoder layer's cross KV."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder: Any = model.get_encoder()  # type: ignore[operator]
        self.cross = _cross_modules(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        """``last_hidden_state`` and ``present.<i>.encoder.key/value``."""
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]
        return {"last_hidden_state": states, "present": _cross_outputs(self.cross, states)}


@set_module("hyperexport.tasks.steps")
class SpeechEncoderStep(nn.Module):
    """The encoder graph of a speech model (Whisper): ``input_features`` in."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder: Any = model.get_encoder()  # type: ignore[operator]
        self.cross = _cross_modules(model)

    def forward(self, input_features: torch.Tensor) -> dict[str, Any]:
        """``last_hidden_state`` and ``present.<i>.encoder.key/value``."""
        states = self.encoder(input_features=input_features)[0]
        return {"last_hidden_state": states, "present": _cross_outputs(self.cross, states)}


@set_module("hyperexport.tasks.steps")
class DecoderStep(nn.Module):
    """One decoder step of a ``*ForConditionalGeneration`` with all KV as explicit tensors.

    Args:
        model: The whole model; its decoder's layers are read from ``model.get_decoder()``.
        encoder_mask: Whether the step takes ``encoder_attention_mask`` (text models; Whisper's
            decoder has none).
    """

    def __init__(self, model: nn.Module, encoder_mask: bool = True) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        self.num_layers = len(stack_layers(model.get_decoder()))  # type: ignore[operator]
        self.hidden_size = int(config.d_model)
        self.encoder_mask = encoder_mask

    def forward(
        self,
        input_ids: torch.Tensor,
        past_key_values: dict[str, dict[str, dict[str, torch.Tensor]]],
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Logits of the new tokens and each layer's present self-attention keys/values."""
        from transformers import DynamicCache, EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for layer in range(self.num_layers):
            kv = past_key_values[str(layer)]
            cache.self_attention_cache.update(kv["decoder"]["key"], kv["decoder"]["value"], layer)
            cache.cross_attention_cache.update(kv["encoder"]["key"], kv["encoder"]["value"], layer)
            cache.is_updated[layer] = True
        cross = past_key_values["0"]["encoder"]["key"]
        # The layers read the cross KV from the cache; the encoder's states only give the
        # cross-attention its length (and mark it as cross-attention), so zeros of that shape.
        states = cross.new_zeros((cross.shape[0], cross.shape[2], self.hidden_size))
        # The decoder's own mask, every past and new position attended: what transformers'
        # decoders make themselves when given none, but only when not compiling. Given, the
        # capture (eager) and the export (torch.export) build the causal mask from the same
        # inputs; otherwise 4.57's BART and mBART size it past + new + 1 under torch.export
        # (past + new eagerly), which their layers, exported from the capture, cannot add.
        past = past_key_values["0"]["decoder"]["key"].shape[2]
        decoder_mask = input_ids.new_ones((input_ids.shape[0], past + input_ids.shape[1]))
        kwargs: dict[str, Any] = {"decoder_attention_mask": decoder_mask}
        if self.encoder_mask:
            kwargs["attention_mask"] = encoder_attention_mask
        output = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=states),
            decoder_input_ids=input_ids,
            use_cache=True,
            **{cache_keyword(): cache},
            **kwargs,
        )
        present: dict[str, Any] = {}
        layers: list[Any] = list(cache.self_attention_cache.layers)
        for i, own in enumerate(layers):
            present[str(i)] = {"decoder": {"key": own.keys, "value": own.values}}
        return {"logits": output.logits, "present": present}
