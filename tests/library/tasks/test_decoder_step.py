"""The decoder graph's module, :class:`~hyperexport.tasks.steps.DecoderStep`, under
``torch.export``: the hierarchical export traces it there while the functions of its layers come
from the eager capture, so both must build the same tensors at the layers' boundary."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import yaml

from hyperexport.library.tasks.steps import DecoderStep
from hyperexport.product.config import RECIPES_DIR
from hyperexport.zoo import random_transformer
from tests.helpers.release_skips import NEEDS_DECODING_TASKS

#: Each test builds or runs a decoding task.
pytestmark = NEEDS_DECODING_TASKS

BATCH, NEW, PAST, ENCODER = 2, 3, 3, 5


def _zoo_model(name: str) -> Any:
    zoo = yaml.safe_load((RECIPES_DIR / f"{name}.yaml").read_text())["model"]
    return random_transformer(
        zoo["model_class"], zoo["config"], seed=zoo["seed"], attn_implementation="eager"
    )


def _step_inputs(model: Any) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
    config = model.config
    heads = int(config.decoder_attention_heads)
    head_size = int(config.d_model) // heads
    generator = torch.Generator().manual_seed(0)

    def kv(length: int) -> torch.Tensor:
        return torch.randn((BATCH, heads, length, head_size), generator=generator)

    past = {
        str(layer): {
            "decoder": {"key": kv(PAST), "value": kv(PAST)},
            "encoder": {"key": kv(ENCODER), "value": kv(ENCODER)},
        }
        for layer in range(int(config.decoder_layers))
    }
    input_ids = torch.randint(3, int(config.vocab_size), (BATCH, NEW), generator=generator)
    return input_ids, past, torch.ones((BATCH, ENCODER), dtype=torch.int64)


@pytest.mark.parametrize("name", ["zoo_bart", "zoo_mbart"])
def test_the_decoder_step_computes_under_torch_export_what_it_computes_eagerly(
    name: str,
) -> None:
    # transformers 4.57's BART and mBART decoders, given no decoder mask, size their causal mask
    # past + new + 1 under torch.export (past + new eagerly), and their eager attention adds it
    # unsliced: the export failed to broadcast 6 keys by 7 mask columns before DecoderStep gave
    # the decoder its mask.
    model = _zoo_model(name)
    step = DecoderStep(model).eval()
    inputs = _step_inputs(model)
    with torch.no_grad():
        eager = step(*inputs)
        program = torch.export.export(step, inputs, strict=False)
        exported = program.module()(*inputs)
    torch.testing.assert_close(exported["logits"], eager["logits"])
    assert eager["logits"].shape == (BATCH, NEW, int(model.config.vocab_size))
    for layer, kv in eager["present"].items():
        for kind in ("key", "value"):
            assert kv["decoder"][kind].shape[2] == PAST + NEW
            torch.testing.assert_close(
                exported["present"][layer]["decoder"][kind], kv["decoder"][kind]
            )
