"""The probe run: a second run at another shape tells which dims are dynamic, per hiera call."""

from __future__ import annotations

import pytest
import torch

from hyperexport import InputError, zoo
from hyperexport.library.api import capture_model


def test_probe_run_finds_the_dynamic_dims_of_module_inputs() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    capture = capture_model(
        model, (ids,), hiera=[LlamaDecoderLayer], dynamic_axes={"input_ids": {1: "seq"}}
    )
    record = capture.record
    assert record.dynamic_dims("in.0") == (1,)
    assert record.dynamic_dims("layers.0#0/in.0") == (1,)  # hidden_states (1, seq, 64)
    assert record.dynamic_dims("out.0") == (1,)
    assert record.probe_inputs is not None


def test_dynamic_axis_on_an_unknown_input_is_named() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 8))
    with pytest.raises(InputError, match="input_idz"):
        capture_model(
            model, (ids,), hiera=[LlamaDecoderLayer], dynamic_axes={"input_idz": {1: "s"}}
        )
