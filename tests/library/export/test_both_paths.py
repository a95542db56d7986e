"""End-to-end hierarchical export of toy models on both export paths (TorchScript and dynamo).

Each model is exported with ``export_hyper_onnx``, checked with ``onnx.checker`` (full check),
run on ONNX Runtime against torch, and its function set is asserted by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    PLACEHOLDER_DOMAIN,
)
from hyperexport.library.options import ExportOptions
from tests.helpers.exports import export_bytes
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.ort import assert_outputs_close, run_ort

TOLERANCE = 1e-5
PATHS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo")]
MODES = ["per_instance", "per_type"]


class Inner(nn.Module):
    """A leaf hiera module with a float kwarg."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.linear(x) * scale


class Mid(nn.Module):
    """Two Inner children; keyword inputs; a dict output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Inner()
        self.b = Inner()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.b(self.a(x), scale=2.0)
        return {"h": h + (y if y is not None else 0.0), "z": x * 3}


class TwoLevels(nn.Module):
    """Two hiera levels (Mid over Inner), Inner also called in a loop at the top level."""

    def __init__(self) -> None:
        super().__init__()
        self.mid = Mid()
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):
            x = self.mid.a(x)
        out = self.mid(y=x, x=x)  # keywords out of signature order
        return self.head(out["h"]), out["z"]


class Flags(nn.Module):
    """A hiera module with int, bool and str arguments and a nested output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, repeat: int = 1, relu: bool = False, mode: str = "sum"
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        h = x
        for _ in range(repeat):
            h = self.linear(h)
        if relu:
            h = torch.relu(h)
        reduced = h.sum(-1) if mode == "sum" else h.mean(-1)
        return h, [reduced, h * 2]


class FlagsModel(nn.Module):
    """Calls the same Flags instance with different constants."""

    def __init__(self) -> None:
        super().__init__()
        self.flags = Flags()

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        h1, (r1, d1) = self.flags(x, repeat=2, relu=True, mode="sum")
        h2, (r2, _) = self.flags(h1, mode="mean")
        return {"h": h2, "parts": (r1 + r2, d1)}


def export_and_run(
    model: nn.Module,
    args: tuple[torch.Tensor, ...],
    *,
    hiera: list[type],
    dynamo: bool,
    mode: str,
) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """Export hierarchically to bytes, full-check, and run on ORT with ``args``."""
    data, _ = export_bytes(
        model,
        args,
        hiera=hiera,
        dynamo=dynamo,
        opset_version=TEST_OPSET,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
    )
    return onnx.load_from_string(data), run_ort(data, [a.numpy() for a in args])


def assert_close(outputs: list[np.ndarray], expected: Any) -> None:
    assert_outputs_close(outputs, expected, TOLERANCE)


def assert_hierarchical(proto: onnx.ModelProto, dynamo: bool, names: set[str]) -> None:
    assert {f.name for f in proto.functions} == names
    assert all(f.domain == FUNCTION_DOMAIN for f in proto.functions)
    every_node = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    assert not [n for n in every_node if n.domain == PLACEHOLDER_DOMAIN]
    assert {p.key: p.value for p in proto.metadata_props}[META_EXPORT_PATH] == f"dynamo={dynamo}"


TWO_LEVEL_FUNCTIONS: dict[str, set[str]] = {
    "per_instance": {"Inner_mid_a", "Inner_mid_b", "Mid_mid"},
    # mid.b is called with scale=2.0, a constant that changes its graph: a variant of its own.
    "per_type": {"Inner", "Inner_v2", "Mid"},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_two_levels_loop_kwargs_dict(dynamo: bool, mode: str) -> None:
    torch.manual_seed(0)
    model = TwoLevels().eval()
    x = torch.randn(2, 4)
    proto, outputs = export_and_run(model, (x,), hiera=[Inner, Mid], dynamo=dynamo, mode=mode)
    assert_hierarchical(proto, dynamo, TWO_LEVEL_FUNCTIONS[mode])
    calls = [n for n in proto.graph.node if n.domain == FUNCTION_DOMAIN]
    assert [n.name for n in calls] == ["mid.a", "mid.a#1", "mid"]
    with torch.no_grad():
        assert_close(outputs, model(x))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_constant_arguments_and_nested_outputs(dynamo: bool, mode: str) -> None:
    torch.manual_seed(0)
    model = FlagsModel().eval()
    x = torch.randn(3, 4)
    proto, outputs = export_and_run(model, (x,), hiera=[Flags], dynamo=dynamo, mode=mode)
    # Two calls with different constants (repeat, relu, mode): two distinct bodies.
    expected = {
        "per_instance": {"Flags_flags", "Flags_flags_v2"},
        "per_type": {"Flags", "Flags_v2"},
    }
    assert_hierarchical(proto, dynamo, expected[mode])
    with torch.no_grad():
        assert_close(outputs, model(x))


@pytest.mark.parametrize("dynamo", PATHS)
def test_repeated_exports_in_one_process(dynamo: bool) -> None:
    torch.manual_seed(0)
    model = TwoLevels().eval()
    x = torch.randn(2, 4)
    first, out1 = export_and_run(model, (x,), hiera=[Inner, Mid], dynamo=dynamo, mode="per_type")
    second, out2 = export_and_run(model, (x,), hiera=[Inner, Mid], dynamo=dynamo, mode="per_type")
    assert {f.name for f in first.functions} == {f.name for f in second.functions}
    for a, b in zip(out1, out2):
        np.testing.assert_array_equal(a, b)
