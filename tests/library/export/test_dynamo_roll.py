"""(A module of the dynamo path only: it skips where torch cannot take it.) ``torch.roll`` along a negative dim on the dynamo path, on every onnxscript release
(``versions.ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG``: up to 0.7.1 its translation is a model ONNX
Runtime refuses, so the program is given non-negative dims there)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyperexport import ExportOptions
from hyperexport.base import versions
from hyperexport.library.export import dynamo_program
from tests.helpers.exports import export_bytes
from tests.helpers.ort import run_ort


class Shift(torch.nn.Module):
    """A hierarchy module that rolls its input by its own shift along the last dim."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.roll(x, shifts=self.shift, dims=-1))


class Shifts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Shift(shift) for shift in (1, 2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Shifts().eval(), torch.randn(2, 8)


@pytest.mark.parametrize("functions", ["per_instance", "per_type"])
def test_a_roll_along_the_last_dim_matches_torch_in_onnx_runtime(functions: str) -> None:
    model, x = _model()
    data, _ = export_bytes(
        model, (x,), hiera=[Shift], dynamo=True, options=ExportOptions(functions=functions)
    )
    got = run_ort(data, [x.numpy()])[0]
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-5)


def test_the_program_rolls_the_same_along_the_non_negative_dims() -> None:
    model, x = _model()
    program = torch.export.export(model.blocks[0], (x,), strict=False)
    rolls = [n for n in program.graph.nodes if n.target is torch.ops.aten.roll.default]
    assert rolls and any(d < 0 for n in rolls for d in (n.args[2] if len(n.args) > 2 else []))
    dynamo_program._roll_dims_made_non_negative(program)
    assert all(d >= 0 for n in rolls for d in n.args[2]), [n.args for n in rolls]
    torch.testing.assert_close(program.module()(x), model.blocks[0](x))


@pytest.mark.skipif(
    not versions.onnxscript_rolls_negative_dims_wrong(),
    reason=f"onnxscript {versions.installed_version('onnxscript')} translates a roll along a "
    "negative dim right (versions.ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG)",
)
def test_without_the_bridge_onnx_runtime_refuses_the_roll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dynamo_program, "onnxscript_rolls_negative_dims_wrong", lambda: False)
    model, x = _model()
    data, _ = export_bytes(model, (x,), hiera=[Shift], dynamo=True)
    with pytest.raises(Exception, match="Incorrect or missing input value for starts and ends"):
        run_ort(data, [x.numpy()])
