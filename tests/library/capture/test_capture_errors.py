"""What capture refuses and reports: inputs it cannot record, hiera classes, failing forwards."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from torch import nn

from hyperexport import (
    HieraError,
    InputError,
    ModelForwardError,
    RecipeError,
    export_hyper_onnx,
)
from hyperexport.library.capture.capture_model import capture_model
from hyperexport.library.capture.torch_hooks import is_tracing
from tests.helpers.toys import Leaf, toy_inputs, toy_net


class TakesObject(nn.Module):
    def forward(self, x: torch.Tensor, cfg: object) -> torch.Tensor:
        return x * 2


class Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Leaf()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x[:, :5])  # Leaf's Linear(8, 8) cannot take 5 features


def test_plain_python_object_input_is_rejected_with_its_name() -> None:
    with pytest.raises(InputError, match="cfg"):
        capture_model(TakesObject(), (torch.ones(2), object()))


def test_hiera_class_that_never_runs_is_a_warning_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        capture = capture_model(toy_net(), toy_inputs(), hiera=[Leaf, TakesObject])
    assert "TakesObject never ran in forward" in caplog.text
    assert capture.record.calls  # the classes that ran are captured


def test_hiera_class_that_never_runs_is_a_recipe_error_in_a_build() -> None:
    with pytest.raises(RecipeError, match="TakesObject never ran") as info:
        capture_model(toy_net(), toy_inputs(), hiera=[Leaf, TakesObject], strict_hiera="r.yaml")
    assert (info.value.recipe, info.value.field) == ("r.yaml", "hiera")


def test_hiera_path_with_a_typo_is_an_error_with_a_close_match() -> None:
    with pytest.raises(HieraError, match="did you mean 'Linear'"):
        capture_model(toy_net(), toy_inputs(), hiera=["torch.nn.Linaer"])


def test_unimportable_hiera_path() -> None:
    with pytest.raises(HieraError, match="cannot be imported"):
        capture_model(toy_net(), toy_inputs(), hiera=["no.such.Module"])


def test_forward_that_raises_names_the_module() -> None:
    with pytest.raises(ModelForwardError) as info:
        capture_model(Broken(), (torch.ones(2, 8),), hiera=[Leaf])
    assert info.value.module_path == "inner.proj"
    assert "'inner.proj'" in str(info.value)


def test_tracer_state_is_restored_after_a_forward_that_raises_inside_a_hiera_call() -> None:
    with pytest.raises(ModelForwardError):
        export_hyper_onnx(Broken(), (torch.ones(2, 8),), io.BytesIO(), hiera=[Leaf], dynamo=False)
    assert not is_tracing()
    # The same process can still capture under the tracer.
    capture = capture_model(toy_net(), toy_inputs(), hiera=[Leaf], dynamo=False)
    assert [c.call_id for c in capture.record.calls][:1] == ["shared#0"]


def test_training_mode_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    model = toy_net().train()
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        capture_model(model, toy_inputs(), hiera=[Leaf])
    assert any("training mode" in r.getMessage() for r in caplog.records)
    assert model.training  # capture does not change the model's mode
