"""The step model exported for generation: past/present KV as tensors, onnxruntime-genai's names.

:class:`CausalLMStep` wraps a transformers ``*ForCausalLM``: its forward takes ``input_ids``,
``attention_mask``, ``position_ids`` and one ``past_key_values.<i>.key/value`` tensor per layer
(as ``past_key_values={"<i>": {"key": ..., "value": ...}}``, whose capture leaf names are the
dotted names; :func:`~hyperexport.models.inputs.make_inputs` nests dotted input names so), and returns ``logits`` and ``present.<i>.key/value``. Run it
inside :func:`hyperexport.transformers.kv_layers.explicit_kv_layers` with
``hiera=[KVStep]``: each decoder layer is then a function with past and present KV as its
inputs and outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hyperexport.versions import cache_keyword


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
