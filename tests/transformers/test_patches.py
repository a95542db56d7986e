"""Each transformers export patch: export fails (or diverges) without it, works with it."""

from __future__ import annotations

import logging

import pytest
import torch

from hyperexport import zoo
from hyperexport.transformers import patches
from hyperexport.transformers.patches import export_patches, patches_for

pytest.importorskip("transformers")

DECODERS = {"llama": zoo.tiny_llama, "qwen2": zoo.tiny_qwen2, "gpt2": zoo.tiny_gpt2}
ALL_MODELS = {**DECODERS, "bert": zoo.tiny_bert, "vit": zoo.tiny_vit}


def _example(name: str) -> tuple[str, torch.Tensor]:
    if name == "vit":
        return "pixel_values", torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return "input_ids", torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))


def _export(name, dynamo, tmp_path, last_hidden):
    key, x = _example(name)
    wrapper = last_hidden(ALL_MODELS[name](), key).eval()
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(
        wrapper, (x,), path, dynamo=dynamo, opset_version=18, input_names=["x"], output_names=["y"]
    )
    with torch.no_grad():
        expected = wrapper(x).numpy()
    return path, x, expected


def test_torchscript_llama_export_fails_without_patch(tmp_path, last_hidden):
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError, match="aten::diff"):
        _export("llama", False, tmp_path, last_hidden)


def test_packed_sequence_patch_alone_leaves_the_enable_gqa_failure(tmp_path, last_hidden):
    # Without packed-sequence masks, transformers asks SDPA for enable_gqa (no mask): the
    # TorchScript exporter cannot convert it, which is what sdpa_without_enable_gqa is for.
    with (
        patches.packed_sequence_without_diff(),
        pytest.raises(AssertionError, match="enable_gqa"),
    ):
        _export("llama", False, tmp_path, last_hidden)


def test_both_torchscript_patches_make_llama_export_run(tmp_path, last_hidden, ort_run, diff):
    with patches.packed_sequence_without_diff(), patches.sdpa_without_enable_gqa():
        path, x, expected = _export("llama", False, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


def test_torchscript_llama_runs_at_another_batch_and_length(tmp_path, last_hidden, ort_run, diff):
    # The packed-sequence branch is decided on the traced values, so no traced batch size is
    # baked into mask indexing: the export runs at shapes it was not traced at.
    model = last_hidden(zoo.tiny_llama(), "input_ids").eval()
    x = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(2))
    path = tmp_path / "dyn.onnx"
    with export_patches(dynamo=False):
        torch.onnx.export(
            model,
            (x,),
            path,
            dynamo=False,
            opset_version=18,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch", 1: "seq"}},
        )
    other = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(other).numpy()
    assert diff(ort_run(path, {"x": other.numpy()})[0], expected) <= 1e-4


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_torchscript_decoders_export_with_parity(name, tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=False) as applied:
        assert applied == [p.name for p in patches_for(False)]
        assert {"packed_sequence_without_diff", "sdpa_without_enable_gqa"} <= set(applied)
        path, x, expected = _export(name, False, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


@pytest.mark.parametrize("name", ["bert", "vit"])
def test_torchscript_encoders_export_with_parity(name, tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=False):
        path, x, expected = _export(name, False, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALL_MODELS))
def test_dynamo_exports_with_parity(name, tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=True) as applied:
        assert applied == ["masks_as_under_torch_export"]
        path, x, expected = _export(name, True, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


def test_dynamo_llama_exports_with_parity(tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=True):
        path, x, expected = _export("llama", True, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


def test_patched_function_matches_original_in_eager():
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    packed = torch.tensor([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]])
    plain = torch.arange(6).expand(2, 6)
    with patches.packed_sequence_without_diff():
        patched = masking_utils.find_packed_sequence_indices
        assert patched is not original
        assert torch.equal(patched(packed), original(packed))
        assert patched(plain) is None and original(plain) is None


def test_patch_restores_on_exception():
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    with pytest.raises(RuntimeError, match="boom"), export_patches(dynamo=False):
        assert masking_utils.find_packed_sequence_indices is not original
        raise RuntimeError("boom")
    assert masking_utils.find_packed_sequence_indices is original


def test_patches_are_keyed_to_version_and_path():
    assert [p.name for p in patches_for(False, "5.24.0")] == [
        "packed_sequence_without_diff",
        "sdpa_without_enable_gqa",
        "exportable_moe",
    ]
    assert [p.name for p in patches_for(True, "5.24.0")] == [
        "exportable_moe",
        "masks_as_under_torch_export",
    ]
    assert patches_for(False, "4.40.0") == []
    assert [p.name for p in patches_for(False, "4.57.6")] == [
        "packed_sequence_without_diff",
        "sdpa_without_enable_gqa",
        "traceable_sdpa_mask_builder",
    ]


def test_applied_patches_are_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger=patches.__name__), export_patches(dynamo=False):
        pass
    assert "packed_sequence_without_diff" in caplog.text


def _layer_mask(model, ids):
    seen = {}

    def hook(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")

    handle = model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen["mask"]


def test_dynamo_mask_patch_makes_eager_capture_see_the_export_mask():
    from hyperexport import zoo
    from hyperexport.transformers.patches import masks_as_under_torch_export

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    assert _layer_mask(model, ids) is None  # eager: no mask, SDPA is_causal instead
    with masks_as_under_torch_export():
        mask = _layer_mask(model, ids)
    assert isinstance(mask, torch.Tensor) and mask.shape[-2:] == (6, 6)
    assert _layer_mask(model, ids) is None  # restored
    assert "masks_as_under_torch_export" in [p.name for p in patches_for(dynamo=True)]
