"""User symbolics for the TorchScript path, given through ExportOptions.custom_ops.

No ``from __future__ import annotations`` here: ``torch.library.custom_op`` reads the op's
schema from ``scaled_add``'s annotations, and torch 2.4 takes them only as types, not as the
strings that import would make of them ("Parameter x has unsupported type torch.Tensor", the
torch-2.4.1 leg)."""

import io
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hyperexport import CustomOpSymbolic, ExportOptions, ModuleExportError, export_hyper_onnx
from hyperexport.base import versions
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.ort import flat_outputs, run_ort


def scaled_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + 2 * y


def _scaled_add_fake(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


if versions.torch_library_has_custom_op():
    _OP = torch.library.custom_op("hyperexport_test::scaled_add", scaled_add, mutates_args=())
    _OP.register_fake(_scaled_add_fake)
else:  # torch 2.2 and 2.3 (versions.TORCH_LIBRARY_HAS_CUSTOM_OP)
    _LIBRARY = torch.library.Library("hyperexport_test", "DEF")
    _LIBRARY.define("scaled_add(Tensor x, Tensor y) -> Tensor")
    _LIBRARY.impl("scaled_add", scaled_add, "CompositeExplicitAutograd")
    torch.library.impl_abstract("hyperexport_test::scaled_add", _scaled_add_fake)


def symbolic_scaled_add(g: Any, x: Any, y: Any) -> Any:
    two = g.op("Constant", value_t=torch.tensor(2.0))
    return g.op("Add", x, g.op("Mul", y, two))


def symbolic_wrong(g: Any, x: Any, y: Any) -> Any:
    return g.op("Add", x, y)  # forgets the factor 2


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.hyperexport_test.scaled_add(self.proj(x), x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mixer = Mixer()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mixer(x))


def _options(symbolic: str) -> ExportOptions:
    op = CustomOpSymbolic("hyperexport_test::scaled_add", f"{__name__}:{symbolic}", TEST_OPSET)
    return ExportOptions(custom_ops=(op,))


def test_registered_symbolic_is_used_inside_the_function() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 4)
    buffer = io.BytesIO()
    export_hyper_onnx(
        model, (x,), buffer, hiera=[Mixer], dynamo=False, options=_options("symbolic_scaled_add")
    )
    proto = onnx.load_from_string(buffer.getvalue())
    (function,) = proto.functions
    assert "Mul" in [n.op_type for n in function.node]
    np.testing.assert_allclose(
        run_ort(buffer.getvalue(), [x.numpy()])[0], flat_outputs(model(x))[0], atol=1e-5
    )


def test_registration_is_undone_after_the_export() -> None:
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 4)
    export_hyper_onnx(
        model,
        (x,),
        io.BytesIO(),
        hiera=[Mixer],
        dynamo=False,
        options=_options("symbolic_scaled_add"),
    )
    with pytest.raises(ModuleExportError, match="mixer"):
        export_hyper_onnx(model, (x,), io.BytesIO(), hiera=[Mixer], dynamo=False)


def test_a_wrong_symbolic_is_caught_by_the_check_and_blamed_on_its_module(tmp_path) -> None:
    from hyperexport.library.api import capture_model, compose_model, export_units, save_model
    from hyperexport.library.check import CheckSettings, run_checks

    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(3, 4)
    options = _options("symbolic_wrong")
    capture = capture_model(model, (x,), hiera=[Mixer])
    export_units(
        model, capture, opset=TEST_OPSET, dynamo=False, options=options, out_dir=tmp_path / "b"
    )
    onnx_model, manifest = compose_model(tmp_path / "b", options=options)
    save_model(onnx_model, tmp_path / "m.onnx", external_data=False)
    report = run_checks(
        tmp_path / "m.onnx", manifest, capture.record, capture.arrays, CheckSettings()
    )
    assert not report.ok
    assert report.first_divergent_module == "mixer"
