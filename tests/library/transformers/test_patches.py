"""Each transformers export patch: export fails (or diverges) without it, works with it."""

from __future__ import annotations

import contextlib
import logging
from contextlib import ExitStack

import pytest
import torch
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

from hyperexport import zoo
from hyperexport.base import versions
from hyperexport.library.transformers import patches
from hyperexport.library.transformers.patches import PATCHES, export_patches, patches_for
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH
from tests.helpers.release_skips import (
    NEEDS_MASKING_UTILS,
    torchscript_export_arguments,
    torchscript_repairs,
)

pytest.importorskip("transformers")

_PACKED = next(p for p in PATCHES if p.name == "packed_sequence_without_diff")
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
    path_arguments = (
        {"dynamo": True, "opset_version": 18} if dynamo else torchscript_export_arguments()
    )
    with contextlib.nullcontext() if dynamo else torchscript_repairs():
        torch.onnx.export(
            wrapper, (x,), path, input_names=["x"], output_names=["y"], **path_arguments
        )
    with torch.no_grad():
        expected = wrapper(x).numpy()
    return path, x, expected


#: What a TorchScript export of tiny Llama raises when one applicable patch is left out.
SYMPTOMS = {
    "packed_sequence_without_diff": (torch.onnx.errors.UnsupportedOperatorError, "aten::diff"),
    # With no mask (the causal case once packed-sequence detection answers "none"), transformers
    # asks SDPA for enable_gqa, which the TorchScript exporter cannot convert.
    "sdpa_without_enable_gqa": (AssertionError, "enable_gqa"),
}


def _all_but(left_out):
    """Every patch the TorchScript path applies but ``left_out``; skips when it applies none."""
    applied = [p for p in patches_for(False) if p.name != left_out]
    if len(applied) == len(patches_for(False)):
        pytest.skip(f"{left_out} is not applied with this transformers release")
    return applied


@pytest.mark.parametrize("left_out", sorted(SYMPTOMS))
def test_torchscript_llama_export_fails_without_each_patch(left_out, tmp_path, last_hidden):
    if left_out == "packed_sequence_without_diff" and versions.masks_without_packed_sequences():
        pytest.skip(
            f"transformers {versions.transformers_version()} applies no packed-sequence mask on "
            f"torch {versions.torch_version()}: the trace drops the detection "
            "(versions.TRANSFORMERS_OLDER_TORCH_MASKS)"
        )
    applied = _all_but(left_out)
    error, message = SYMPTOMS[left_out]
    with ExitStack() as stack:
        for patch in applied:
            stack.enter_context(patch.factory())
        with pytest.raises(error, match=message):
            _export("llama", False, tmp_path, last_hidden)


def test_the_torchscript_patches_make_llama_export_run(tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=False):
        path, x, expected = _export("llama", False, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


def _export_at_one_shape_run_at_another(patch_list, tmp_path, last_hidden, ort_run):
    """Export tiny Llama traced at (1, 16) with dynamic axes under ``patch_list``; run at (2, 7)."""
    model = last_hidden(zoo.tiny_llama(), "input_ids").eval()
    x = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(2))
    path = tmp_path / "dyn.onnx"
    with ExitStack() as stack:
        for patch in patch_list:
            stack.enter_context(patch.factory())
        stack.enter_context(torchscript_repairs())
        torch.onnx.export(
            model,
            (x,),
            path,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch", 1: "seq"}},
            **torchscript_export_arguments(),
        )
    other = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(other).numpy()
    return ort_run(path, {"x": other.numpy()})[0], expected


def test_torchscript_llama_runs_at_another_batch_and_length(tmp_path, last_hidden, ort_run, diff):
    # The packed-sequence branch is decided on the traced values, and masks are built from
    # broadcast indices, so no traced size is baked in: the export runs at other shapes.
    got, expected = _export_at_one_shape_run_at_another(
        patches_for(False), tmp_path, last_hidden, ort_run
    )
    assert diff(got, expected) <= 1e-4


def test_without_the_traceable_mask_builder_llama_fails_at_another_length(
    tmp_path, last_hidden, ort_run
):
    # transformers 4.x vmaps the mask function: the trace reshapes to the traced length.
    applied = _all_but("traceable_sdpa_mask_builder")
    if versions.sdpa_nan_on_fully_masked_rows():
        # Before that, transformers' in-place fix of fully masked rows stops the export
        # (versions.TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS).
        failure = pytest.raises(torch.onnx.errors.UnsupportedOperatorError, match="__ior_")
    else:
        failure = pytest.raises(Fail, match="Reshape")
    with failure:
        _export_at_one_shape_run_at_another(applied, tmp_path, last_hidden, ort_run)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_torchscript_decoders_export_with_parity(name, tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=False) as applied:
        assert applied == [p.name for p in patches_for(False)]
        # keyed to transformers 4.54 on (before it, masks are built without find_packed_sequence)
        assert ("packed_sequence_without_diff" in applied) == versions.release_in(
            versions.transformers_version() or "0", _PACKED.transformers
        )
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
        # (the MoE patch is applied on every dynamo export too; it only touches MoE blocks)
        assert "masks_as_under_torch_export" in applied
        path, x, expected = _export(name, True, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


@NEEDS_DYNAMO_PATH
def test_dynamo_llama_exports_with_parity(tmp_path, last_hidden, ort_run, diff):
    with export_patches(dynamo=True):
        path, x, expected = _export("llama", True, tmp_path, last_hidden)
    assert diff(ort_run(path, {"x": x.numpy()})[0], expected) <= 1e-4


@NEEDS_MASKING_UTILS
def test_patched_function_matches_original_in_eager():
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    packed = torch.tensor([[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]])
    plain = torch.arange(6).expand(2, 6)
    with patches.packed_sequence_without_diff():
        patched = masking_utils.find_packed_sequence_indices
        assert patched is not original
        assert torch.equal(patched(packed), original(packed))
        # "Not packed": None, or (transformers 4.57, which always returns the ids) all zeros.
        assert patched(plain) is None
        unpacked = original(plain)
        assert unpacked is None or not unpacked.any()


@NEEDS_MASKING_UTILS
def test_patch_restores_on_exception():
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    with pytest.raises(RuntimeError, match="boom"), export_patches(dynamo=False):
        assert masking_utils.find_packed_sequence_indices is not original
        raise RuntimeError("boom")
    assert masking_utils.find_packed_sequence_indices is original


def test_patches_are_keyed_to_version_and_path():
    assert [p.name for p in patches_for(False, "5.24.0", "2.13.0")] == [
        "packed_sequence_without_diff",
        "sdpa_without_enable_gqa",
        "exportable_moe",
    ]
    assert [p.name for p in patches_for(True, "5.24.0", "2.13.0")] == [
        "exportable_moe",
        "masks_as_under_torch_export",
        "model_masks_as_under_torch_export",
    ]
    assert patches_for(False, "4.40.0", "2.13.0") == []
    assert [p.name for p in patches_for(False, "4.57.6", "2.13.0")] == [
        "packed_sequence_without_diff",
        "traceable_sdpa_mask_builder",
    ]
    assert [p.name for p in patches_for(True, "4.57.6", "2.13.0")] == [
        "masks_as_under_torch_export",
        "model_masks_as_under_torch_export",
    ]
    # before masking_utils, the older mask helpers decide the same (modeling_attn_mask_utils)
    assert [p.name for p in patches_for(True, "4.51.3", "2.13.0")] == [
        "masks_as_under_torch_export",
        "model_masks_as_under_torch_export",
    ]


def test_the_dynamo_path_broadcasts_4x_masks_below_torch_2_13():
    """torch 2.9's torch.export cannot trace 4.57's vmapped mask builder at dynamic sizes."""
    for torch_release in ("2.9.1", "2.12.0"):
        assert [p.name for p in patches_for(True, "4.57.6", torch_release)] == [
            "broadcast_sdpa_mask_for_torch_export",
            "masks_as_under_torch_export",
            "model_masks_as_under_torch_export",
        ]
    assert "broadcast_sdpa_mask_for_torch_export" not in [
        p.name for p in patches_for(True, "5.24.0", "2.9.1")
    ]
    assert [p.name for p in patches_for(False, "4.57.6", "2.9.1")] == [
        "packed_sequence_without_diff",
        "traceable_sdpa_mask_builder",
    ]


@NEEDS_MASKING_UTILS
def test_applied_patches_are_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger=patches.__name__), export_patches(dynamo=False):
        pass
    assert "packed_sequence_without_diff" in caplog.text


def _layer_mask(model, ids):
    """The mask the first layer gets, with an all-ones padding mask (nothing masked)."""
    seen = {}

    def hook(module, args, kwargs):
        seen["mask"] = kwargs.get("attention_mask")

    handle = model.layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        handle.remove()
    return seen["mask"]


def test_dynamo_mask_patch_makes_eager_capture_see_the_export_mask():
    from hyperexport import zoo
    from hyperexport.library.transformers.patches import masks_as_under_torch_export

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    assert _layer_mask(model, ids) is None  # eager: no mask, SDPA is_causal instead
    with masks_as_under_torch_export():
        mask = _layer_mask(model, ids)
    assert isinstance(mask, torch.Tensor) and mask.shape[-2:] == (6, 6)
    assert _layer_mask(model, ids) is None  # restored
    assert "masks_as_under_torch_export" in [p.name for p in patches_for(dynamo=True)]


def test_model_modules_answer_the_export_question_as_under_torch_export():
    """T5 (4.x) and BART (by 4.55, and 5.x) make an all-ones mask eagerly only when given
    none, asking in their own module; the release decides which of them asks."""
    import importlib

    from hyperexport.library.transformers.patches import model_masks_as_under_torch_export

    candidates = [
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        for name in ("t5", "bart")
    ]
    asking = [m for m in candidates if hasattr(m, "is_torchdynamo_compiling")]
    if not asking:
        pytest.skip(f"transformers {versions.transformers_version()}: neither T5 nor BART asks")
    originals = [m.is_torchdynamo_compiling for m in asking]
    assert all(question() is False for question in originals)
    with model_masks_as_under_torch_export():
        assert all(m.is_torchdynamo_compiling() is True for m in asking)
    assert [m.is_torchdynamo_compiling for m in asking] == originals


@NEEDS_DYNAMO_PATH
def test_a_t5_encoder_without_a_mask_exports_on_the_dynamo_path(tmp_path, ort_run):
    """T5 on 4.x gives its blocks an all-ones mask eagerly and none under torch.export: without
    model_masks_as_under_torch_export its blocks had 3 tensor inputs at capture, 2 at export."""
    from transformers import T5Config, T5EncoderModel
    from transformers.models.t5.modeling_t5 import T5Block

    from hyperexport.library.api import export_hyper_onnx

    torch.manual_seed(0)
    config = T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    config._attn_implementation = "eager"
    model = T5EncoderModel(config).eval()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    path = tmp_path / "t5.onnx"
    export_hyper_onnx(model, (ids,), str(path), hiera=[T5Block], dynamo=True)
    (got,) = ort_run(path, {"input_ids": ids.numpy()})[:1]
    with torch.no_grad():
        expected = model(ids).last_hidden_state.numpy()
    assert abs(got - expected).max() < 1e-4


@NEEDS_MASKING_UTILS
def test_the_traceable_mask_builder_builds_transformers_masks():
    from transformers import masking_utils

    from hyperexport.library.transformers.masks import traceable_sdpa_mask

    builder = traceable_sdpa_mask()
    if builder is None:
        pytest.skip("this transformers release builds traceable masks itself")
    padding = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    # row 0's first query (position 2) may attend to no key: transformers' allow_torch_fix
    deep_padding = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool)
    packed = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 0]])
    cases = [
        {"mask_function": masking_utils.causal_mask_function},
        {"mask_function": masking_utils.sliding_window_causal_mask_function(3)},
        {"mask_function": masking_utils.causal_mask_function, "attention_mask": padding},
        {"mask_function": masking_utils.causal_mask_function, "attention_mask": deep_padding},
    ]
    # transformers' own builder cannot build a packed-sequence mask on older torch, and does not
    # need to (versions.TRANSFORMERS_OLDER_TORCH_MASKS)
    if not versions.masks_without_packed_sequences():
        packed_causal = masking_utils.and_masks(
            masking_utils.causal_mask_function,
            masking_utils.packed_sequence_mask_function(packed),
        )
        cases.append({"mask_function": packed_causal})
    for case in cases:
        offset = 2 if "attention_mask" in case else 0
        args = {
            "batch_size": 2,
            "cache_position": torch.arange(6) + offset,
            "kv_length": 6 + offset,
            "allow_is_causal_skip": False,
            **case,
        }
        if versions.sdpa_nan_on_fully_masked_rows() and "attention_mask" not in case:
            # transformers' fix is in place on an expanded mask and fails at batch 2 there
            # (versions.TORCH_SDPA_NAN_ON_FULLY_MASKED_ROWS); without padding every row's is the same
            want = masking_utils.sdpa_mask(**{**args, "batch_size": 1}).expand(2, -1, -1, -1)
        else:
            want = masking_utils.sdpa_mask(**args)
        got = builder(**args)
        assert got.shape == want.shape == (2, 1, 6, 6 + offset)
        assert torch.equal(got, want)
