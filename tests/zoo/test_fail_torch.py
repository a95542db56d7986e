"""The zoo's expected failures that are torch's own: a plain ``torch.onnx.export`` of the same
model, inputs and dynamic axes fails the same way (strict xfail carrying the reason from
``hyperexport.zoo.EXPECTED_FAILURES``, so a torch release that fixes it shows up here)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

from hyperexport.zoo import EXPECTED_FAILURES


def _model_and_inputs(name: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    from hyperexport.config import compose_recipe
    from hyperexport.from_recipe.model import load_model
    from hyperexport.models.auto import resolve_auto

    recipe, _ = compose_recipe([f"recipe={name}"])
    model = load_model(recipe.data["model"], recipe.checkpoint, recipe.file)
    data = resolve_auto(recipe.data, model, recipe.file)
    return model, data["inputs"], data


def _positional(model: Any, names: list[str]) -> Any:
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> Any:
            return self.model(**dict(zip(names, args))).last_hidden_state

    return Positional().eval()


def _plain_torchscript_export_matches_torch(name: str) -> None:
    import numpy as np
    import onnxruntime as ort
    import torch

    from hyperexport.models.inputs import make_inputs

    model, specs, _ = _model_and_inputs(name)
    names = list(specs)
    wrapped = _positional(model, names)
    example = make_inputs(specs)
    axes = {n: {int(a): d for a, d in s["dynamic"].items()} for n, s in specs.items()}
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            wrapped,
            tuple(example[n] for n in names),
            buffer,
            dynamo=False,
            opset_version=18,
            input_names=names,
            dynamic_axes=axes,
        )
        expected = wrapped(*(example[n] for n in names)).numpy()
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {n: example[n].numpy() for n in names})
    np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.zoo
@pytest.mark.xfail(reason=EXPECTED_FAILURES[("zoo_cohere", False)], strict=True, raises=Fail)
def test_plain_torchscript_export_of_cohere_runs_in_onnxruntime() -> None:
    try:
        _plain_torchscript_export_matches_torch("zoo_cohere")
    except Fail as e:
        # The reshape of the query, as the reason says (any other error fails the test).
        assert "Reshape" in str(e) and "self_attn" in str(e)
        raise
