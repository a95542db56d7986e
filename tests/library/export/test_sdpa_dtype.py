"""The TorchScript path's SDPA in 16-bit floats: the attention returns the query's dtype, and
its given scale is a value of that dtype.

torch's TorchScript symbolic makes a boolean mask additive with float32 constants, and the
exporter's promotion turned a bfloat16 decoder layer's output into float32 under a bfloat16
declaration, which ``onnx.checker`` refuses (``export/torch_exporter.py`` ``repaired_sdpa_symbolic``).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import onnx
import pytest
import torch

from hyperexport import ExportOptions, zoo
from hyperexport.base import versions
from hyperexport.library.export import torch_exporter, torchscript
from hyperexport.models.pretrained import pretrained
from tests.helpers.exports import export_bytes
from tests.helpers.opsets import TEST_OPSET


def _layer_class() -> type:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return LlamaDecoderLayer


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))


@pytest.mark.skipif(
    versions.sdpa_symbolic_refuses_bfloat16_mask(),
    reason=f"torch {versions.torch_version()}'s TorchScript SDPA symbolic refuses a bfloat16 "
    "mask (versions.SDPA_SYMBOLIC_REFUSES_BFLOAT16_MASK)",
)
def test_bfloat16_checkpoint_layer_passes_the_checker(tmp_path: Path) -> None:
    zoo.tiny_llama(num_layers=2, causal_lm=True).to(torch.bfloat16).save_pretrained(tmp_path)
    model = pretrained(str(tmp_path), auto_class="AutoModelForCausalLM", dtype="bfloat16")
    # export_bytes runs onnx.checker's full check, which refused the layer before the fix.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data, _ = export_bytes(
            model,
            (_ids(),),
            hiera=[_layer_class()],
            dynamo=False,
            opset_version=TEST_OPSET,
            options=ExportOptions(functions="per_type"),
        )
    # The scale is given in bfloat16: no promotion casts it to torch's number for bfloat16,
    # which ONNX reads as complex128 (torch 2.5 refused it, later releases fold it).
    assert not [w for w in caught if "complex" in str(w.message)]
    proto = onnx.load_from_string(data)
    (layer,) = proto.functions
    last = next(n for n in layer.node if layer.output[0] in n.output)
    producers = {o: n for n in layer.node for o in n.output}
    # The residual Add adds two bfloat16 values: no cast to float32 feeds it.
    fed_by = [producers[i] for i in last.input if i in producers]
    casts_to_float = [
        n for n in fed_by if n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.FLOAT
    ]
    assert last.op_type == "Add" and not casts_to_float
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


@pytest.mark.skipif(
    versions.sdpa_symbolic_reads_scale_as_float(),
    reason="below torch 2.5 the repair also gives SDPA's scale as a value, without which the "
    "export fails (versions.SDPA_SYMBOLIC_READS_SCALE_AS_FLOAT)",
)
@pytest.mark.parametrize("mode", ["per_type", "per_instance"])
def test_float32_export_is_unchanged(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    def export() -> bytes:
        data, _ = export_bytes(
            zoo.tiny_llama(num_layers=2),
            (_ids(),),
            hiera=[_layer_class()],
            dynamo=False,
            opset_version=TEST_OPSET,
            options=ExportOptions(functions=mode),  # type: ignore[arg-type]
        )
        return data

    # the dtype repair alone: the masked-row repair changes boolean-mask graphs below torch 2.9
    # on purpose (tests/export/test_sdpa_masked_rows.py)
    monkeypatch.setattr(torch_exporter, "sdpa_symbolic_leaves_masked_rows_nan", lambda: False)
    wrapped = export()
    monkeypatch.setattr(torchscript, "repaired_sdpa_symbolic", contextlib.nullcontext)
    assert export() == wrapped
