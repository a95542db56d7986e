"""Issue 22 item 5: per_type says why instances of one class get separate functions (manifest and
log), and instances whose difference never reaches the graph share one function.

What split the four models the issue names, found with small configs: GPT-BigCode, Starcoder2
and SigLIP read ``mlp.act.act``, a ``functools.partial`` (``gelu, approximate="tanh"``) made per
instance and told apart by identity; BEiT's first layer has ``drop_path = Identity`` and the
next a ``BeitDropPath`` (``drop_path_rate``), a no-op in eval mode.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from hyperexport import ExportOptions
from hyperexport.library.capture import tree
from tests.helpers.exports import export_bytes
from tests.helpers.ort import run_ort

PATHS = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])


class Scaled(torch.nn.Module):
    """Reads ``layer_idx`` in forward: as a factor (changes the graph) or in a test (does not)."""

    def __init__(self, layer_idx: int, as_factor: bool) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.as_factor = as_factor
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.as_factor:
            return y * (self.layer_idx + 1)
        return y if self.layer_idx >= 0 else -y


class Stack(torch.nn.Module):
    def __init__(self, as_factor: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Scaled(i, as_factor) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _tensors(value: Any) -> list[np.ndarray]:
    tensors: list[torch.Tensor] = []
    tree.flatten(value, "output", tensors)
    return [t.detach().numpy() for t in tensors]


def _export(model: torch.nn.Module, x: torch.Tensor, hiera: list[Any], dynamo: bool) -> Any:
    data, manifest = export_bytes(
        model, (x,), hiera=hiera, dynamo=dynamo, options=ExportOptions(functions="per_type")
    )
    with torch.no_grad():
        want = _tensors(model(x))
    got = run_ort(data, [x.numpy()])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4)
    return onnx.load_from_string(data), manifest


def _split_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("per_type:")]


@PATHS
def test_an_attribute_read_in_forward_that_changes_the_graph_is_named(
    dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    caplog.set_level(logging.INFO, logger="hyperexport")
    proto, manifest = _export(Stack(as_factor=True).eval(), torch.randn(2, 4), [Scaled], dynamo)
    assert len(proto.functions) == 3
    reasons = {f.module_paths: f.split_reason for f in manifest.functions}
    assert reasons[("layers.0",)] == ""
    assert reasons[("layers.2",)] == (
        "differs from 'layers.0': attribute 'layer_idx' read in forward: 0 vs 2"
    )
    lines = _split_lines(caplog)
    assert len(lines) == 2 and all("gets a function of its own" in line for line in lines)
    assert "'layers.1'" in lines[0] and "'layer_idx' read in forward: 0 vs 1" in lines[0]


@PATHS
def test_an_attribute_read_that_does_not_change_the_graph_shares_one_function(
    dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    caplog.set_level(logging.INFO, logger="hyperexport")
    proto, manifest = _export(Stack(as_factor=False).eval(), torch.randn(2, 4), [Scaled], dynamo)
    assert len(proto.functions) == 1
    (function,) = manifest.functions
    assert function.module_paths == ("layers.0", "layers.1", "layers.2")
    assert function.split_reason == ""
    lines = _split_lines(caplog)
    assert len(lines) == 2
    assert all("exports the same graph" in line and "'layer_idx'" in line for line in lines)


def test_the_manifest_field_round_trips() -> None:
    from hyperexport.base.contracts.manifest import ExportManifest, FunctionEntry

    entry = FunctionEntry("d", "F_v2", "m.F", ("a",), "differs from 'b': attribute 'x'")
    manifest = ExportManifest(False, 18, "per_type", (), (), (entry,), ())
    assert ExportManifest.loads(manifest.dumps()).functions == (entry,)


def _gpt_bigcode() -> tuple[torch.nn.Module, torch.Tensor, list[Any]]:
    from transformers import GPTBigCodeConfig, GPTBigCodeModel
    from transformers.models.gpt_bigcode.modeling_gpt_bigcode import GPTBigCodeBlock

    config = GPTBigCodeConfig(
        n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=64, use_cache=False
    )
    model = GPTBigCodeModel(config).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, ids, [GPTBigCodeBlock]


def _beit() -> tuple[torch.nn.Module, torch.Tensor, list[Any]]:
    from transformers import BeitConfig, BeitModel
    from transformers.models.beit.modeling_beit import BeitLayer

    config = BeitConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        image_size=32,
        patch_size=8,
        drop_path_rate=0.1,
    )
    model = BeitModel(config).eval()
    return model, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)), [BeitLayer]


@pytest.mark.parametrize(
    ("kind", "dynamo"),
    [
        ("gpt_bigcode", False),
        pytest.param("gpt_bigcode", True, marks=pytest.mark.slow),
        ("beit", False),
        pytest.param("beit", True, marks=pytest.mark.slow),
    ],
)
def test_transformers_layers_that_used_to_split_share_one_function(
    kind: str, dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    caplog.set_level(logging.INFO, logger="hyperexport")
    model, x, hiera = _gpt_bigcode() if kind == "gpt_bigcode" else _beit()
    proto, manifest = _export(model, x, hiera, dynamo)
    assert len(proto.functions) == 1
    assert len(manifest.functions[0].module_paths) == 2
    if kind == "beit":  # split by the plan, joined once both graphs proved equal
        (line,) = _split_lines(caplog)
        assert "submodule 'drop_path'" in line and "BeitDropPath" in line
        assert "exports the same graph" in line
    else:  # the activation partial is compared by value: no split at all
        assert _split_lines(caplog) == []
