"""The zoo's expected failures that are torch's own: a plain ``torch.onnx.export`` of the same
model, inputs and dynamic axes fails the same way (strict xfail carrying the reason from
``hyperexport.zoo.EXPECTED_FAILURES``, so a torch release that fixes it shows up here), on the
installed transformers (the expectations depend on it: ``hyperexport.zoo.expected_failures``)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument
from torch.onnx.errors import UnsupportedOperatorError

from hyperexport.base import versions
from hyperexport.library.export.torch_exporter import decomposition_without_input_guards
from hyperexport.zoo import EXPECTED_FAILURES
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH

#: How a plain TorchScript export of Cohere fails on the installed transformers and torch. Below
#: torch 2.5 it fails at export: on 4.x's in-place mask fix where masking_utils builds the mask,
#: else on SDPA's scale. From 2.5: 4.x's vmapped mask builder (4.53 to 4.57, from torch 2.6) fails
#: the tracer; otherwise its graph fails in ONNX Runtime, in the rotary embedding's expand before
#: 5.19, in a reshape of the query after.
_COHERE_PLAIN: tuple[type[Exception], tuple[str, ...]]
if versions.masks_fixed_in_place():
    _COHERE_PLAIN = (UnsupportedOperatorError, ("aten::__ior_",))
elif versions.sdpa_symbolic_reads_scale_as_float():
    # its SDPA symbolic fails on the scale transformers gives, first
    _COHERE_PLAIN = (TypeError, ("scaled_dot_product_attention",))
elif versions.masks_built_by_vmap() and not versions.masks_without_packed_sequences():
    _COHERE_PLAIN = (RuntimeError, ("unordered_map::at",))
elif versions.cohere_rotary_expands_to_batch():
    _COHERE_PLAIN = (InvalidArgument, ("invalid expand shape", "rotary_emb"))
else:
    _COHERE_PLAIN = (Fail, ("Reshape", "self_attn"))

#: With hyperexport's traceable mask builder (on 4.x), the tracer gets past the masks: below torch
#: 2.5 to SDPA's scale, from 2.5 to the rotary embedding's expand.
_COHERE_TRACEABLE: tuple[type[Exception], tuple[str, ...]] = (
    (TypeError, ("scaled_dot_product_attention",))
    if versions.sdpa_symbolic_reads_scale_as_float()
    else (InvalidArgument, ("invalid expand shape", "rotary_emb"))
)


def _model_and_inputs(name: str, dynamo: bool) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    from hyperexport.library.models.auto import resolve_auto
    from hyperexport.product.config import compose_recipe
    from hyperexport.product.from_recipe.model import load_model

    # on the path the plain export takes (a dynamo recipe is refused where torch cannot take it)
    recipe, _ = compose_recipe([f"recipe={name}", f"dynamo={str(dynamo).lower()}"])
    model = load_model(recipe.data["model"], recipe.checkpoint, recipe.file)
    data = resolve_auto(recipe.data, model, recipe.file)
    return model, data["inputs"], data


def _positional(model: Any, names: list[str]) -> Any:
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> Any:
            return self.model(**dict(zip(names, args))).last_hidden_state

    return Positional().eval()


def _plain_export_matches_torch(name: str, dynamo: bool) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    from hyperexport.library.models.inputs import make_inputs

    model, specs, _ = _model_and_inputs(name, dynamo)
    names = list(specs)
    wrapped = _positional(model, names)
    example = make_inputs(specs)
    axes = {n: {int(a): d for a, d in s["dynamic"].items()} for n, s in specs.items()}
    dims: dict[str, Any] = {"dynamic_axes": axes}
    if dynamo:  # one entry, for forward's *args
        dims = {
            "dynamic_shapes": (
                tuple({a: torch.export.Dim.DYNAMIC for a in axes[n]} for n in names),
            )
        }
    # a file: torch 2.6's dynamo export takes no BytesIO
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{name}.onnx")
        # (with torch 2.9's own bug, pytorch/pytorch#172903, stepped around as hyperexport does: any
        # dynamo export with dynamic shapes fails there with "name 'L' is not defined", whatever the
        # model; the step around touches no graph)
        with torch.no_grad(), decomposition_without_input_guards():
            torch.onnx.export(
                wrapped,
                tuple(example[n] for n in names),
                path,
                # torch below 2.5 has no dynamo keyword (its only exporter is TorchScript)
                **({"dynamo": True} if dynamo else versions.torchscript_export_keywords()),
                opset_version=18 if dynamo else versions.torchscript_opset(18),
                input_names=names,
                **dims,
            )
            expected = wrapped(*(example[n] for n in names)).numpy()
        graph = onnx.load(path).graph  # (the dynamo path may write its weights beside it)
        for value in graph.input:  # the declared dynamic dims stayed dynamic
            shape = value.type.tensor_type.shape.dim
            assert all(shape[a].dim_param and not shape[a].dim_value for a in axes[value.name])
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {n: example[n].numpy() for n in names})
    np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.mark.zoo
@pytest.mark.xfail(
    reason=EXPECTED_FAILURES[("zoo_cohere", False)], strict=True, raises=_COHERE_PLAIN[0]
)
def test_plain_torchscript_export_of_cohere_runs_in_onnxruntime() -> None:
    error, words = _COHERE_PLAIN
    try:
        _plain_export_matches_torch("zoo_cohere", dynamo=False)
    except error as e:
        # The failure the reason names (any other error fails the test).
        assert all(w in str(e) for w in words), e
        raise


@pytest.mark.zoo
@pytest.mark.skipif(
    not versions.masks_built_by_vmap(), reason="only transformers 4.x needs the traceable masks"
)
@pytest.mark.xfail(
    reason=EXPECTED_FAILURES[("zoo_cohere", False)], strict=True, raises=_COHERE_TRACEABLE[0]
)
def test_plain_torchscript_export_of_cohere_with_traceable_masks_runs_in_onnxruntime() -> None:
    """With the mask builder hyperexport swaps in on 4.x (so that the tracer gets past the
    masks), torch's export of Cohere still fails (:data:`_COHERE_TRACEABLE`)."""
    from hyperexport.library.transformers.patches import export_patches

    error, words = _COHERE_TRACEABLE
    with export_patches(dynamo=False) as applied:
        assert "traceable_sdpa_mask_builder" in applied
        try:
            _plain_export_matches_torch("zoo_cohere", dynamo=False)
        except error as e:
            assert all(w in str(e) for w in words), e
            raise


@pytest.mark.zoo
@NEEDS_DYNAMO_PATH
def test_plain_dynamo_export_of_swin_with_a_dynamic_batch_runs_in_onnxruntime() -> None:
    """torch's own dynamo export of Swin with a dynamic batch works, on 4.57 (hand-written
    attention) and on 5.x (SDPA), so ``zoo_swin`` has no expected failure. (It had one on 5.x
    while hyperexport ran torch.onnx's decompositions with autograd on: a view of SDPA's
    transposed output at a symbolic batch failed there; they run under ``no_grad`` now.)"""
    _plain_export_matches_torch("zoo_swin", dynamo=True)
