"""Issue 34: ``task: forward`` of an encoder-decoder failed in the trace on every T5, BART and
Whisper (``EncoderDecoderCache cannot cross the ONNX boundary``): its forward now runs without a
cache, every stack's config restored afterwards."""

from __future__ import annotations

import logging

import pytest
import torch

from hyperexport.base.contracts.names import FORWARD
from hyperexport.library.tasks.models import model_part

transformers = pytest.importorskip("transformers")


def _t5() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    return transformers.T5ForConditionalGeneration(config).eval()


def _use_cache(model: torch.nn.Module) -> list[bool]:
    return [m.config.use_cache for m in model.modules() if hasattr(m, "config")]


def test_forward_of_an_encoder_decoder_runs_without_a_cache(caplog) -> None:
    model = _t5()
    before = _use_cache(model)
    assert True in before  # the model and its decoder stack; T5's encoder stack has it off
    ids = torch.tensor([[5, 6, 7, 1]])
    scope = model_part(FORWARD).scope(model, {}, "/r.yaml", "")
    with (
        caplog.at_level(logging.INFO, logger="hyperexport.library.tasks.task"),
        scope as (scoped, params),
    ):
        assert scoped is model and params == {}
        assert not any(_use_cache(model))
        out = model(input_ids=ids, decoder_input_ids=ids)
    assert getattr(out, "past_key_values", None) is None and getattr(out, "cache", None) is None
    assert _use_cache(model) == before  # restored
    assert "task: text2text-generation" in caplog.text and "use_cache=False" in caplog.text


def test_a_decoder_only_model_is_left_as_it_is() -> None:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with model_part(FORWARD).scope(model, {}, "/r.yaml", ""):
        assert model.config.use_cache is True
