"""The TorchScript path's SDPA on a query row that may attend to no key (a left-padded position).

torch's SDPA returns zeros for such a row (2.5 on); torch's TorchScript symbolic exports the
``Softmax`` of a row of ``-inf``, NaN in ONNX Runtime, before 2.9. hyperexport's repaired symbolic
(``export/torch_exporter.py``) zeroes the row on those releases, and leaves the symbolic alone
from 2.9, where torch does the same.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import torch

from hyperexport import ExportOptions
from hyperexport.base import versions
from tests.helpers.exports import export_bytes
from tests.helpers.opsets import TEST_OPSET


class MaskedAttention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(2, 8, 2, 8).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


class Wrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = MaskedAttention()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.attention(x, mask) + 1.0


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    mask[1, :, :3, :] = False  # row 1's first three positions are padding: they attend to nothing
    mask[1, :, 3:, :3] = False
    return x, mask


def test_a_fully_masked_row_is_zero_in_onnx_runtime_and_the_others_match_torch() -> None:
    torch.manual_seed(0)
    model = Wrapper().eval()
    x, mask = _inputs()
    data, _ = export_bytes(
        model,
        (x, mask),
        hiera=[MaskedAttention],
        dynamo=False,
        opset_version=TEST_OPSET,
        options=ExportOptions(functions="per_type"),
    )
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    (got,) = session.run(None, dict(zip(names, [x.numpy(), mask.numpy()])))
    with torch.no_grad():
        want = model(x, mask).numpy()
    padded = got[1, :, :3]
    assert not np.isnan(got).any()
    # a row attending to nothing is SDPA's zeros, plus the wrapper's 1
    np.testing.assert_array_equal(padded, np.ones_like(padded))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1, :, 3:], want[1, :, 3:], rtol=1e-5, atol=1e-5)


def test_the_repair_is_only_on_releases_whose_symbolic_leaves_nan() -> None:
    x, mask = _inputs()
    data, _ = export_bytes(
        Wrapper().eval(),
        (x, mask),
        hiera=[MaskedAttention],
        dynamo=False,
        opset_version=TEST_OPSET,
        options=ExportOptions(functions="per_type"),
    )
    (function,) = onnx.load_from_string(data).functions
    ops = [n.op_type for n in function.node]
    # torch's own guard (2.9 on) is a Where on IsNaN; ours a Where on the mask's ReduceMax
    assert ("ReduceMax" in ops) == versions.sdpa_symbolic_leaves_masked_rows_nan()
    assert ("IsNaN" in ops) != versions.sdpa_symbolic_leaves_masked_rows_nan()
