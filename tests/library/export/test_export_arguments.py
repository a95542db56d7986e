"""export_hyper_onnx's arguments read as torch.onnx.export and HyperONNX read them, on both paths.

Root class in ``hiera``, a trailing dict in ``args``, fewer ``output_names`` than outputs,
external data beside the target whatever the working directory holds, and a file object with
``external_data`` refused before anything runs.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from hyperexport import ExportOptions, OptionsError, export_hyper_onnx
from tests.helpers.exports import export_bytes
from tests.helpers.ort import flat_outputs, run_ort

PATHS = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.proj(x)
        return y if mask is None else y * mask


class Top(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = Cell()

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.cell(x, mask=mask)
        return y + 1, y * 2, x - 1


def _model() -> Top:
    torch.manual_seed(0)
    return Top().eval()


def _x() -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1))


def _mask() -> torch.Tensor:
    return (torch.arange(8).reshape(2, 4) % 3 != 0).float()


def _assert_matches_torch(data: bytes, expected: object, inputs: list[torch.Tensor]) -> None:
    got = run_ort(data, [t.numpy() for t in inputs])
    for g, e in zip(got, flat_outputs(expected), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


@PATHS
def test_root_class_in_hiera_becomes_the_outermost_function(dynamo: bool) -> None:
    model, x = _model(), _x()
    data, _ = export_bytes(model, (x,), hiera=[Top, Cell], dynamo=dynamo)
    proto = onnx.load_from_string(data)
    (call,) = proto.graph.node  # the main graph is one call of the root's function
    root_fn = next(f for f in proto.functions if f.name == call.op_type)
    assert root_fn.name.startswith("Top")
    assert any(n.op_type.startswith("Cell") for n in root_fn.node)  # nested inside the root
    assert [i.name for i in proto.graph.input] == ["x"]
    _assert_matches_torch(data, model(x), [x])


@PATHS
def test_trailing_dict_in_args_is_keyword_arguments(dynamo: bool) -> None:
    model, x, mask = _model(), _x(), _mask()
    data, _ = export_bytes(model, (x, {"mask": mask}), hiera=[Cell], dynamo=dynamo)
    proto = onnx.load_from_string(data)
    assert [i.name for i in proto.graph.input] == ["x", "mask"]
    _assert_matches_torch(data, model(x, mask=mask), [x, mask])


def test_a_keyword_given_twice_is_an_options_error() -> None:
    x, mask = _x(), _mask()
    with pytest.raises(OptionsError, match="mask"):
        export_hyper_onnx(
            _model(),
            (x, {"mask": mask}),
            io.BytesIO(),
            kwargs={"mask": mask},
            hiera=[Cell],
            dynamo=False,
        )


@PATHS
def test_fewer_output_names_name_the_first_and_number_the_rest(dynamo: bool) -> None:
    model, x = _model(), _x()
    data, _ = export_bytes(model, (x,), hiera=[Cell], output_names=["y"], dynamo=dynamo)
    proto = onnx.load_from_string(data)
    assert [o.name for o in proto.graph.output] == ["y", "output_1", "output_2"]
    _assert_matches_torch(data, model(x), [x])


def test_more_output_names_than_outputs_is_an_options_error() -> None:
    with pytest.raises(OptionsError, match="4 names for 3"):
        export_hyper_onnx(
            _model(), (_x(),), io.BytesIO(), output_names=list("abcd"), hiera=[Cell], dynamo=False
        )


def test_external_data_with_a_file_object_fails_before_the_export(monkeypatch) -> None:
    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model ran")

    model = _model()
    monkeypatch.setattr(model, "forward", must_not_run)
    with pytest.raises(OptionsError, match="external_data"):
        export_hyper_onnx(
            model, (_x(),), io.BytesIO(), hiera=[Cell], external_data=True, dynamo=False
        )


def _export_with_data(model: nn.Module, path: Path, dynamo: bool) -> None:
    export_hyper_onnx(
        model,
        (_x(),),
        path,
        hiera=[Cell],
        dynamo=dynamo,
        external_data=True,
        options=ExportOptions(external_data_threshold=16),
    )


@PATHS
def test_external_data_beside_the_target_whatever_the_cwd_holds(
    dynamo: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = _model(), _x()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (cwd / "m.onnx.data").write_bytes(b"unrelated")  # onnx's writer refused this before
    target = tmp_path / "sub" / "m.onnx"
    _export_with_data(model, target, dynamo)
    _export_with_data(model, target, dynamo)  # twice to the same path
    _export_with_data(model, Path("m.onnx"), dynamo)  # and over the cwd's own files
    assert (cwd / "m.onnx.data").read_bytes() != b"unrelated"
    for path in (target, cwd / "m.onnx"):
        assert (path.parent / "m.onnx.data").stat().st_size > 0
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (got, *_) = session.run(None, {"x": x.numpy()})
        np.testing.assert_allclose(got, model(x)[0].detach().numpy(), atol=1e-5)
    assert sorted(os.listdir(target.parent)) == ["m.onnx", "m.onnx.data"]  # no temp leftovers


class _Runs(Top):
    """Records that forward ran: bad input must be refused before the model runs."""

    ran = False

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        _Runs.ran = True
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("lambda", "model"),
        ("hiera_string", "hiera"),
        ("f_directory", "f"),
        ("f_unwritable", "f"),
        ("f_under_a_file", "f"),
        ("symbolic_not_callable", "custom_ops"),
        ("symbolic_missing", "custom_ops"),
    ],
)
def test_bad_library_input_is_typed_and_refused_before_the_model_runs(
    tmp_path: Path, case: str, field: str
) -> None:
    """Issue 21: a lambda gave an AttributeError, hiera="Blk" was read letter by letter, an f
    that is a folder ran the whole model then failed untyped."""
    from hyperexport.library.options import CustomOpSymbolic

    _Runs.ran = False
    model: object = _Runs()
    hiera: object = [Cell]
    f: object = tmp_path / "m.onnx"
    options = ExportOptions()
    if case == "lambda":
        model = lambda x: x  # noqa: E731
    elif case == "hiera_string":
        hiera = "Cell"
    elif case == "f_directory":
        f = tmp_path
    elif case == "f_unwritable":
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        f = locked / "m.onnx"
    elif case == "f_under_a_file":
        (tmp_path / "afile").write_text("x")
        f = tmp_path / "afile" / "sub" / "m.onnx"
    elif case.startswith("symbolic"):
        target = "os:sep" if case == "symbolic_not_callable" else "os:no_such_symbolic"
        options = ExportOptions(custom_ops=(CustomOpSymbolic("my::op", target, 18),))
    with pytest.raises(OptionsError) as raised:
        export_hyper_onnx(
            model, (torch.randn(2, 4),), f, hiera=hiera, dynamo=False, options=options
        )
    assert raised.value.field == field, raised.value
    assert not _Runs.ran
