"""The check on models made by the real exporter (TorchScript path), correct and deliberately broken."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from hyperexport.base.contracts.manifest import ExportManifest  # noqa: E402
from hyperexport.base.errors import CheckError  # noqa: E402
from hyperexport.library.api import capture_model, export_hyper_onnx  # noqa: E402
from hyperexport.library.check import CheckReport, CheckSettings, run_checks  # noqa: E402
from hyperexport.library.options import ExportOptions  # noqa: E402
from tests.helpers.opsets import TEST_OPSET  # noqa: E402
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH  # noqa: E402


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = Lin()

    def forward(self, x):
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = Lin()

    def forward(self, x):
        h = self.head(self.block(x))
        return self.head(h), -h


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


SETTINGS = CheckSettings(
    expected_classes=(qualname(Block), qualname(Lin)),
    expected_opset=TEST_OPSET,
    expected_dynamo=False,
)


def export(tmp_path: Path, mode: str, dynamo: bool = False) -> tuple[Path, ExportManifest, object]:
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 4)
    path = tmp_path / mode / "model.onnx"
    manifest = export_hyper_onnx(
        net, (x,), path, hiera=[Block, Lin], dynamo=dynamo, options=ExportOptions(functions=mode)
    )
    capture = capture_model(net, (x,), hiera=(Block, Lin))
    return path, manifest, capture


def check(path: Path, manifest: ExportManifest, capture) -> CheckReport:
    return run_checks(path, manifest, capture.record, capture.arrays, SETTINGS)


def break_head_bias(path: Path, manifest: ExportManifest) -> Path:
    """Add 0.5 to the bias of module ``head``: in its function (per-instance) or in the
    main-graph initializer passed to it (per-type). Saves and returns ``broken.onnx``."""
    model = ir.load(path)
    site = next(c for c in manifest.calls if c.module_path == "head")
    if manifest.function_mode == "per_type":
        name = next(w for w in site.weight_inputs if w.endswith("bias"))
        value = model.graph.initializers[name]
        assert value.const_value is not None
        value.const_value = ir.tensor(value.const_value.numpy() + np.float32(0.5), name=name)
    else:
        function = model.functions[(site.domain, site.name, "")]
        node = next(n for n in function if n.op_type == "Constant" and "bias" in n.outputs[0].name)
        bias = node.attributes["value"].as_tensor().numpy()
        node.attributes["value"] = ir.AttrTensor("value", ir.tensor(bias + np.float32(0.5)))
    broken = path.with_name("broken.onnx")
    ir.save(model, broken)
    return broken


@pytest.mark.parametrize("mode", ["per_instance", "per_type"])
def test_exported_model_passes(tmp_path: Path, mode: str) -> None:
    path, manifest, capture = export(tmp_path, mode)
    report = check(path, manifest, capture)
    assert report.ok, report.summary_lines()
    assert [f.call_id for f in report.functions] == ["block#0", "block.lin#0", "head#0", "head#1"]
    assert all(f.max_abs is not None for f in report.functions)


@pytest.mark.parametrize("mode", ["per_instance", "per_type"])
def test_exported_model_with_edited_weight_names_the_module(tmp_path: Path, mode: str) -> None:
    path, manifest, capture = export(tmp_path, mode)
    broken = break_head_bias(path, manifest)
    report = check(broken, manifest, capture)
    assert not report.end_to_end_ok
    assert report.first_divergent_module == "head"
    assert report.first_divergent_call == "head#0"
    with pytest.raises(CheckError, match="first divergent module in execution order: 'head'"):
        report.raise_for_failure()


@NEEDS_DYNAMO_PATH
@pytest.mark.slow
def test_dynamo_export_passes(tmp_path: Path) -> None:
    path, manifest, capture = export(tmp_path, "per_instance", dynamo=True)
    settings = replace(SETTINGS, expected_dynamo=True)
    report = run_checks(path, manifest, capture.record, capture.arrays, settings)
    assert report.ok, report.summary_lines()
    assert len(report.functions) == 4


@pytest.mark.slow
def test_tiny_llama_broken_mlp_is_localised_with_first_instance_scope(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama as ml

    from hyperexport import zoo
    from hyperexport.library.transformers.patches import export_patches

    model = zoo.tiny_llama(num_layers=4)
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    hiera = (ml.LlamaDecoderLayer, ml.LlamaAttention, ml.LlamaMLP)
    path = tmp_path / "llama.onnx"
    with export_patches(False):
        manifest = export_hyper_onnx(model, (ids,), path, hiera=list(hiera), dynamo=False)
        capture = capture_model(model, (ids,), hiera=hiera)
    settings = CheckSettings(
        function_scope="first_instance", expected_classes=tuple(map(qualname, hiera))
    )
    assert run_checks(path, manifest, capture.record, capture.arrays, settings).ok

    onnx_model = ir.load(path)
    site = next(c for c in manifest.calls if c.module_path == "layers.2.mlp")
    function = onnx_model.functions[(site.domain, site.name, "")]
    node = next(
        n
        for n in function
        if n.op_type == "Constant" and n.attributes["value"].as_tensor().size > 100
    )
    weight = node.attributes["value"].as_tensor().numpy().copy()
    weight.flat[0] += 0.5
    node.attributes["value"] = ir.AttrTensor("value", ir.tensor(weight))
    broken = tmp_path / "broken.onnx"
    ir.save(onnx_model, broken)

    report = run_checks(broken, manifest, capture.record, capture.arrays, settings)
    assert not report.end_to_end_ok
    assert report.first_divergent_module == "layers.2.mlp"
    assert "layers.3#0" in report.unchecked_calls  # localisation stopped at the divergence
