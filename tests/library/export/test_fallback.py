"""The export's fallback (hyperexport.library.export.fallback): retried once on the other path, on a
capture made for that path, logged and recorded."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hyperexport import ModuleExportError, export_hyper_onnx, zoo
from hyperexport.base.contracts.bundle import BUNDLE_JSON
from hyperexport.base.contracts.capture_spec import CaptureSpec
from hyperexport.base.contracts.manifest import META_EXPORT_PATH, META_FALLBACK
from hyperexport.library.capture.container import Capture
from hyperexport.library.export import fallback
from hyperexport.library.export.fallback import CaptureCall, export_with_fallback
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.registry import path_for
from hyperexport.library.options import ExportOptions
from tests.helpers.ort import run_ort
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH

#: Each test falls back from or to the dynamo path.
pytestmark = NEEDS_DYNAMO_PATH


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _capture_call(model: nn.Module, x: torch.Tensor) -> CaptureCall:
    """A capture of ``model`` on ``x`` with ``Block`` as hiera, from its frozen specification."""
    spec = CaptureSpec(hiera=(f"{__name__}.Block",), method="forward", dynamo=False)
    return CaptureCall(model, (x,), None, spec, (Block,))


class DataDependent(nn.Module):
    """Branches on a tensor value: torch.export cannot trace it, the TorchScript tracer can."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.block(x)
        if h.sum() > 0:
            return h * 2
        return h


def _model() -> tuple[DataDependent, torch.Tensor]:
    torch.manual_seed(0)
    return DataDependent().eval(), torch.randn(2, 4)


def test_retry_recaptures_for_the_other_path_and_records_the_first_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, x = _model()
    call = _capture_call(model, x)
    asked: list[ExportPath] = []

    def recapture(path: ExportPath) -> Capture:
        asked.append(path)
        return call(path)

    first = call(path_for(True))
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        bundle, used = export_with_fallback(
            model,
            first,
            path=path_for(True),
            opset=18,
            options=ExportOptions(fallback=True),
            out_dir=tmp_path,
            recapture=recapture,
        )
    assert asked == [path_for(False)]
    assert used is not first
    assert not bundle.dynamo
    assert bundle.fallback_from is not None
    assert bundle.fallback_from.startswith("dynamo=True: ModuleExportError")
    on_disk = json.loads((tmp_path / BUNDLE_JSON).read_text())
    assert on_disk["fallback_from"] == bundle.fallback_from
    assert sorted(p.name for p in (tmp_path / "units").glob("*.onnx")) == [
        f"{u.name}.onnx" for u in sorted(bundle.units, key=lambda u: u.name)
    ]
    warnings = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "dynamo=True" in warnings[0].getMessage()


def test_no_fallback_unless_asked(tmp_path: Path) -> None:
    model, x = _model()
    capture = _capture_call(model, x)(path_for(True))
    with pytest.raises(ModuleExportError, match="dynamo=True"):
        export_with_fallback(
            model, capture, path=path_for(True), opset=18, options=ExportOptions(), out_dir=tmp_path
        )


def test_failing_on_both_paths_raises_the_retry_error_caused_by_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_fails(model, capture, *, dynamo, **kwargs):
        raise ModuleExportError("block", dynamo, RuntimeError(f"no luck on dynamo={dynamo}"))

    monkeypatch.setattr(fallback, "export_units", always_fails)
    model, x = _model()
    capture = _capture_call(model, x)(path_for(False))
    with pytest.raises(ModuleExportError, match="dynamo=True") as info:
        export_with_fallback(
            model,
            capture,
            path=path_for(False),
            opset=18,
            options=ExportOptions(fallback=True),
            out_dir=tmp_path,
        )
    assert isinstance(info.value.__cause__, ModuleExportError)
    assert "dynamo=False" in str(info.value.__cause__)


def test_fallback_is_logged_and_recorded_in_the_model() -> None:
    model, x = _model()
    buffer = io.BytesIO()
    export_hyper_onnx(
        model, (x,), buffer, hiera=[Block], dynamo=True, options=ExportOptions(fallback=True)
    )
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta[META_EXPORT_PATH] == "dynamo=False"
    assert meta[META_FALLBACK].startswith("dynamo=True: ModuleExportError")
    assert {f.name for f in proto.functions} == {"Block_block"}
    with torch.no_grad():
        np.testing.assert_allclose(run_ort(proto, [x.numpy()])[0], model(x).numpy(), atol=1e-5)


def test_fallback_captures_again_for_the_other_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama layer gets 5 tensor inputs in a dynamo capture but 4 in a TorchScript one (the
    SDPA mask); falling back must re-capture, not reuse the first path's capture."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    real = fallback.export_units

    def dynamo_fails(model, capture, *, dynamo, **kwargs):
        if dynamo:
            raise ModuleExportError("", True, RuntimeError("simulated dynamo failure"))
        return real(model, capture, dynamo=dynamo, **kwargs)

    monkeypatch.setattr(fallback, "export_units", dynamo_fails)
    model = zoo.tiny_llama(num_layers=2)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    buffer = io.BytesIO()
    manifest = export_hyper_onnx(
        model,
        (ids,),
        buffer,
        hiera=[LlamaDecoderLayer],
        dynamo=True,
        options=ExportOptions(fallback=True),
    )
    assert manifest.fallback_from and "simulated dynamo failure" in manifest.fallback_from
    assert not manifest.dynamo
    got = run_ort(buffer.getvalue(), [ids.numpy()])[0]
    np.testing.assert_allclose(
        got, model(input_ids=ids).last_hidden_state.detach().numpy(), atol=1e-4
    )


def test_the_dynamo_flag_entry_is_deprecated_and_calls_the_one_fallback(tmp_path: Path) -> None:
    """``export_units_with_fallback`` warns, then behaves as ``export_with_fallback`` on
    ``path_for(dynamo)``: its ``recapture`` gets the dynamo flag of the retry's path."""
    model, x = _model()
    call = _capture_call(model, x)
    asked: list[bool] = []

    def recapture(dynamo: bool) -> Capture:
        asked.append(dynamo)
        return call(path_for(dynamo))

    with pytest.warns(DeprecationWarning, match="export_with_fallback"):
        bundle, _ = fallback.export_units_with_fallback(
            model,
            call(path_for(True)),
            opset=18,
            dynamo=True,
            options=ExportOptions(fallback=True),
            out_dir=tmp_path,
            recapture=recapture,
        )
    assert asked == [False]
    assert bundle.fallback_from is not None and not bundle.dynamo
