"""The export-path interface (hyperexport.library.export.path) and its registry: one path object per
``dynamo`` value answers everything that differs between paths."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import onnx_ir as ir
import pytest
import torch
from torch import nn

from hyperexport.base import versions
from hyperexport.base.contracts.names import OPSET_RANGES
from hyperexport.base.errors import OpsetError
from hyperexport.library.capture.container import Capture
from hyperexport.library.export import registry
from hyperexport.library.export.dynamo_path import DynamoPath
from hyperexport.library.export.jobs import UnitJob
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.registry import EXPORT_PATHS, path_for
from hyperexport.library.export.torchscript import TorchScriptPath
from hyperexport.library.export.units import export_units
from hyperexport.library.options import ExportOptions
from hyperexport.product.config import OPSET_RANGES as RECIPE_OPSET_RANGES
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH
from tests.helpers.toys import Leaf, toy_inputs, toy_net


@NEEDS_DYNAMO_PATH
def test_the_flag_selects_one_path_each() -> None:
    assert isinstance(path_for(False), TorchScriptPath)
    assert isinstance(path_for(True), DynamoPath)
    assert [p.label for p in (path_for(False), path_for(True))] == ["dynamo=False", "dynamo=True"]
    assert all(key == path.dynamo for key, path in EXPORT_PATHS.items())


def _skip_unless_served(dynamo: bool) -> None:
    if problems := versions.unsupported(dynamo):
        pytest.skip(problems[0])


@pytest.mark.parametrize("dynamo", [False, True])
def test_recipe_opset_ranges_agree_with_the_paths(dynamo: bool) -> None:
    _skip_unless_served(dynamo)
    low, high = OPSET_RANGES[dynamo]
    cap = None if dynamo else versions.torchscript_opset_cap()
    assert path_for(dynamo).opsets == range(low, min(high, cap or high) + 1)
    assert RECIPE_OPSET_RANGES[dynamo] == (low, high)  # what recipe validation checks


@pytest.mark.parametrize("dynamo", [False, True])
def test_check_opset_takes_the_ends_of_the_range_and_names_what_is_outside(dynamo: bool) -> None:
    _skip_unless_served(dynamo)
    path = path_for(dynamo)
    path.check_opset(path.opsets.start)
    path.check_opset(path.opsets.stop - 1)
    with pytest.raises(OpsetError, match=f"opset {path.opsets.stop}.*{path.label}"):
        path.check_opset(path.opsets.stop)
    with pytest.raises(OpsetError, match="opset 6"):
        path.check_opset(6)


class SeesTheTracer(nn.Module):
    """Returns, in its values, whether it ran under the TorchScript tracer."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + float(torch.jit.is_tracing())


@pytest.mark.parametrize(("dynamo", "traced"), [(False, 1.0), (True, 0.0)])
def test_each_path_captures_the_model_as_it_will_export_it(dynamo: bool, traced: float) -> None:
    capture = path_for(dynamo).capture(SeesTheTracer().eval(), (torch.zeros(2),))
    (out,) = [t.key for t in capture.record.tensors if t.key.startswith("out.")]
    assert capture.tensor(out).tolist() == [traced, traced]


class RecordingPath(TorchScriptPath):
    """The TorchScript path, counting what it is asked: stands in for a third path."""

    name = "recording"
    opsets = range(7, 19)

    def __init__(self) -> None:
        self.exported: list[list[str]] = []

    def export(
        self,
        jobs: Sequence[UnitJob],
        *,
        model: torch.nn.Module,
        modules: Mapping[str, torch.nn.Module],
        capture: Capture,
        opset: int,
        options: ExportOptions,
    ) -> Iterator[tuple[str, ir.Model]]:
        self.exported.append([job.name for job in jobs])
        return super().export(
            jobs, model=model, modules=modules, capture=capture, opset=opset, options=options
        )


def test_export_units_asks_only_the_registered_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recording = RecordingPath()
    monkeypatch.setitem(registry.EXPORT_PATHS, False, recording)
    model, args = toy_net(), toy_inputs()
    capture = recording.capture(model, args, hiera=(Leaf,))
    with pytest.raises(OpsetError, match="recording"):
        export_units(
            model, capture, opset=19, dynamo=False, options=ExportOptions(), out_dir=tmp_path
        )
    bundle = export_units(
        model, capture, opset=TEST_OPSET, dynamo=False, options=ExportOptions(), out_dir=tmp_path
    )
    assert recording.exported == [[u.name for u in bundle.units]]
    assert all((tmp_path / "units" / f"{u.name}.onnx").is_file() for u in bundle.units)


def test_a_path_must_implement_the_interface() -> None:
    class Incomplete(ExportPath):
        name = "incomplete"
        dynamo = False
        opsets = range(7, 8)

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


# A TorchScript export in a fresh process, then whether it loaded onnxscript.
_TORCHSCRIPT_ONLY = """
import json, sys
from pathlib import Path
from hyperexport import export_hyper_onnx
from tests.helpers.toys import Block, toy_inputs, toy_net
export_hyper_onnx(toy_net(), toy_inputs(), Path(sys.argv[1]) / "m.onnx", hiera=[Block], dynamo=False)
print("LOADED " + json.dumps("onnxscript" in sys.modules))
"""


def test_a_torchscript_export_does_not_load_the_dynamo_paths_libraries(tmp_path: Path) -> None:
    # onnxscript alone is about 24 MB of RSS; only the dynamo path's export needs it.
    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "-c", _TORCHSCRIPT_ONLY, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=repo,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("LOADED ")]
    # torch's own ``import torch.onnx`` loads onnxscript on some releases (2.2.2 does): what
    # hyperexport must not add is measured against that, in a fresh process too.
    torch_onnx_alone = subprocess.run(
        [sys.executable, "-c", "import sys, torch.onnx; print('onnxscript' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert line == f"LOADED {torch_onnx_alone.lower()}", line
    assert (tmp_path / "m.onnx").is_file()
