"""Every recipe composes, validates and instantiates; bad recipes fail with one clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import versions
from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.registry import task_named
from hyperexport.product.config import RECIPES_DIR, compose_recipe, validate_recipe
from tests.helpers.recipes import RECIPES, composed, model_missing, release_refusals
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION, NEEDS_OPSET_18


def _refused_here(name: str) -> bool:
    """True (after checking the refusal: only fields the installed releases refuse, each in its
    one line) when this torch or transformers is too old for the recipe."""
    refusals = release_refusals(name)
    if not refusals:
        return False
    with pytest.raises(RecipeError) as refused:
        compose_recipe([f"recipe={name}"])
    if "class" in refusals:
        assert refusals["class"] in str(refused.value)
        return True
    # every line is one of the release's refusals (validation may stop after the first ones)
    errors = getattr(refused.value, "errors", (refused.value,))
    assert all(e.field in refusals and refusals[e.field] in e.reason for e in errors), str(
        refused.value
    )
    return True


def test_the_expected_recipes_exist() -> None:
    assert {"tiny_llama", "llama", "resnet", "vit"} <= set(RECIPES)
    assert {"llama_attention", "qwen2", "gpt2", "llama_dynamic"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(name: str) -> None:
    if _refused_here(name):
        return
    recipe, build = composed(name)
    assert recipe.name == name
    assert recipe.file == str(RECIPES_DIR / f"{name}.yaml")
    assert recipe.data["model"]["_target_"].startswith("hyperexport.zoo.")
    assert build.force == ()


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_instantiates(name: str) -> None:
    import torch

    from hyperexport.library.models.auto import resolve_auto
    from hyperexport.library.models.inputs import make_inputs
    from hyperexport.product.from_recipe.model import load_model, resolve_classes

    if _refused_here(name):
        return
    if missing := model_missing(name):
        pytest.skip(missing)
    recipe, _ = composed(name)
    model = load_model(recipe.data["model"], recipe.checkpoint, recipe.file)
    assert isinstance(model, torch.nn.Module)
    task = task_named(recipe.data["task"])
    if task.graphs:  # two graphs, each with the task's own inputs
        from hyperexport.library.tasks.models import model_part

        for graph in task.graphs:
            scope = model_part(task.name).scope(model, recipe.data, str(recipe.file), graph)
            with scope as (module, params):
                classes = resolve_classes(params["hiera"], recipe.file)
                modules = list(module.modules())
                assert classes and all(any(isinstance(m, c) for m in modules) for c in classes)
                with torch.no_grad():
                    module(**make_inputs(params["inputs"]))
        return
    data = resolve_auto(recipe.data, model, recipe.file)  # hiera: auto, inputs: auto
    classes = resolve_classes(data["hiera"], recipe.file)
    assert classes and all(any(isinstance(m, c) for m in model.modules()) for c in classes)
    inputs = make_inputs(data["inputs"])
    with torch.no_grad():
        model(**inputs)
    again = make_inputs(data["inputs"])
    assert all(torch.equal(inputs[k], again[k]) for k in inputs)


def test_default_recipe_is_tiny_llama() -> None:
    recipe, _ = compose_recipe([])
    assert recipe.name == "tiny_llama"


def test_short_overrides_reach_every_field() -> None:
    recipe, build = compose_recipe(
        [
            "recipe=llama",
            "opset=17",
            "functions=per_type",
            "check.atol=1e-3",
            "build.force=[export]",
        ]
    )
    assert recipe.data["opset"] == 17
    assert recipe.data["functions"] == "per_type"
    assert recipe.data["check"]["atol"] == 1e-3
    assert build.force == ("export",)


def test_recipe_file_outside_the_repo(tmp_path: Path) -> None:
    text = (RECIPES_DIR / "tiny_llama.yaml").read_text().replace("name: tiny_llama", "name: mine")
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    recipe, _ = compose_recipe(["opset=17"], recipe_file=path)
    assert (recipe.name, recipe.file, recipe.data["opset"]) == ("mine", str(path), 17)


def _base() -> dict[str, Any]:
    return {
        "name": "t",
        "model": {"_target_": "hyperexport.zoo.tiny_llama"},
        "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
        "dynamo": False,
    }


def _with(path: str, value: Any, *, delete: bool = False) -> dict[str, Any]:
    data = _base()
    target = data
    *parents, last = path.split(".")
    for part in parents:
        target = target.setdefault(part, {})
    if delete:
        del target[last]
    else:
        target[last] = value
    return data


def _dynamic(
    *,
    dynamic: dict[int, str] | None = None,
    check_shape: list[int] | None = None,
    mask: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The base recipe with ``input_ids`` dynamic (and, optionally, a second input ``mask``)."""
    data = _with("inputs.input_ids.dynamic", dynamic or {0: "batch", 1: "seq"})
    data["inputs"]["input_ids"]["check_shape"] = check_shape or [2, 7]
    if mask is not None:
        data["inputs"]["mask"] = {"dtype": "int64", "low": 0, "high": 2, **mask}
    return data


def test_dynamic_inputs_validate() -> None:
    recipe = validate_recipe(_dynamic(), "/somewhere/ok.yaml")
    assert recipe.data["inputs"]["input_ids"]["check_shape"] == [2, 7]


@NEEDS_HYPEREXPORT_ATTENTION
def test_fusion_validates() -> None:
    fused = {
        **_with("attention", {"implementation": "hyperexport"}),
        "rewrite": {"fuse": "onnxruntime"},
    }
    assert validate_recipe(fused, "/somewhere/ok.yaml").data["rewrite"]["fuse"] == "onnxruntime"


@NEEDS_HYPEREXPORT_ATTENTION
def test_an_attention_implementation_without_a_fusion_is_refused() -> None:
    """The exported attention node is hyperexport's own: without rewrite.fuse no runtime could
    run it, and the build would fail at evaluate or check after the export."""
    with pytest.raises(RecipeError) as info:
        validate_recipe(_with("attention", {"implementation": "hyperexport"}), "/x/bad.yaml")
    assert info.value.field == "attention.implementation"
    assert "set rewrite.fuse" in info.value.reason


@NEEDS_OPSET_18  # rewrite.fuse: standard needs an export opset of 18 or more
def test_fusion_without_an_attention_implementation_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        recipe = validate_recipe({**_base(), "rewrite": {"fuse": "standard"}}, "/x/ok.yaml")
    assert recipe.data["rewrite"]["fuse"] == "standard"
    assert "leaves attention unfused" in caplog.text


def test_rewrite_defaults_are_off() -> None:
    recipe = validate_recipe(_base(), "/somewhere/ok.yaml")
    assert recipe.data["rewrite"] == {
        "fold_leftovers": False,
        "fuse_constants": False,
        "optimize": False,
        "weights_as_initializers": False,
        "fuse": "none",
    }
    assert recipe.data["fallback"] is False


BAD = [
    (_with("opst", 17), "opst", "did you mean 'opset'"),
    (_with("check.atl", 1e-3), "check.atl", "did you mean 'atol'"),
    (_with("hiera", None, delete=True), "hiera", "missing required field"),
    (_with("opset", 21), "opset", "out of range for dynamo=False"),
    # where the installed releases cannot take the dynamo path, that is the one line (the opset
    # is then not judged: tests/test_cli.py)
    (
        {**_with("opset", 25), "dynamo": True},
        *(
            ("dynamo", versions.unsupported(True)[0])
            if versions.unsupported(True)
            else ("opset", "out of range for dynamo=True")
        ),
    ),
    (
        _with("hiera", ["transformers.models.llama.modeling_llama.LlamaDecoderLayr"]),
        "hiera[0]",
        "did you mean 'LlamaDecoderLayer'",
    ),
    (
        _with("hiera", ["transformers.models.llama.modeling_lama.LlamaDecoderLayer"]),
        "hiera[0]",
        "did you mean 'transformers.models.llama.modeling_llama'",
    ),
    (_with("hiera", ["nosuchpackage.Layer"]), "hiera[0]", "no module named 'nosuchpackage'"),
    (_with("model._target_", "hyperexport.zoo.tiny_lama"), "model._target_", "tiny_llama"),
    (_with("inputs.input_ids.dtype", "int46"), "inputs.input_ids.dtype", "did you mean 'int64'"),
    (_with("inputs.input_ids.shape", [1, 0]), "inputs.input_ids.shape", "positive"),
    (_with("inputs.input_ids.shape", "1x4"), "inputs.input_ids.shape", "must be a list"),
    (_with("check.atol", 0), "check.atol", "must be > 0"),
    (_with("check.rtol", -1e-3), "check.rtol", "must be > 0"),
    (_with("check.per_output", {"out.0": {"atol": 0.0}}), "check.per_output.out.0.atol", "> 0"),
    (_with("functions", "per_typ"), "functions", "did you mean 'per_type'"),
    (_with("dynamo", "yes"), "dynamo", "true or false"),
    (_with("dynamo", None, delete=True), "dynamo", "missing required field (true or false)"),
    (_with("env", ["HF_HOME", "1BAD"]), "env[1]", "not an environment variable name"),
    (_with("env", ["A", "A"]), "env", "names a variable twice"),
    (_with("env", "HF_HOME"), "env", "must be a list"),
    (_with("task", "text-generatoin"), "task", "did you mean 'text-generation'"),
    (_with("task", "auto"), "task", "auto needs a local transformers checkpoint"),
    (_with("fallback", "yes"), "fallback", "true or false"),
    (
        _with("attention", {"implementation": "hyperexport", "promote_opset24": True}),
        "attention.promote_opset24",
        "retired: replaced by rewrite.fuse: standard",
    ),
    (_with("rewrite", {"fuse": "onnxrt"}), "rewrite.fuse", "did you mean 'onnxruntime'"),
    (_with("attention", {"implementation": "sdpa"}), "attention.implementation", "built-in"),
    (
        # without attention.implementation (which transformers before 4.53 refuses first)
        {**_base(), "rewrite": {"fuse": "standard"}, "opset": 17},
        "opset",
        "must be >= 18",
    ),
    (_with("inputs.input_ids.dynamic", {2: "seq"}), "inputs.input_ids.dynamic", "outside the rank"),
    (_with("inputs.input_ids.dynamic", {1: "s q"}), "inputs.input_ids.dynamic.1", "identifier"),
    (
        _with("inputs.input_ids.check_shape", [2, 7]),
        "inputs.input_ids.check_shape",
        "needs dynamic axes",
    ),
    (
        _dynamic(check_shape=[2, 7, 1]),
        "inputs.input_ids.check_shape",
        "has rank 3, shape [1, 4] has 2",
    ),
    (_dynamic(check_shape=[2, 4]), "inputs.input_ids.check_shape", "must differ"),
    (_dynamic(dynamic={1: "seq"}, check_shape=[2, 7]), "inputs.input_ids.check_shape", "stay 1"),
    (_dynamic(check_shape=[0, 7]), "inputs.input_ids.check_shape", "positive"),
    (
        _dynamic(mask={"shape": [1, 5], "dynamic": {1: "seq"}}),
        "inputs.mask.shape",
        "dim 'seq' is 5 on axis 1 but 4 in inputs.input_ids",
    ),
    (
        _dynamic(mask={"shape": [1, 4], "dynamic": {1: "seq"}}),
        "inputs.mask.check_shape",
        "dim 'seq' is None here but 7",
    ),
    (_with("check.expect_ops", {"Attention": -1}), "check.expect_ops.Attention", ">= 0"),
    (_with("check.expect_ops", {"Attention": "4"}), "check.expect_ops.Attention", "integer"),
]


@pytest.mark.parametrize(
    ("data", "field", "reason"), BAD, ids=[b[1] + ":" + b[2][:12] for b in BAD]
)
def test_bad_recipe_names_file_and_field(data: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(RecipeError) as info:
        validate_recipe(data, "/somewhere/bad.yaml")
    assert info.value.field == field
    assert info.value.recipe == "/somewhere/bad.yaml"
    assert reason in info.value.reason
    assert str(info.value).startswith(f"recipe /somewhere/bad.yaml: field '{field}'")


def test_checkpoint_resolves_relative_to_the_recipe(tmp_path: Path) -> None:
    (tmp_path / "w.safetensors").write_bytes(b"x")
    recipe = validate_recipe(_with("checkpoint", "w.safetensors"), str(tmp_path / "r.yaml"))
    assert recipe.checkpoint == tmp_path / "w.safetensors"
    with pytest.raises(RecipeError, match="does not exist"):
        validate_recipe(_with("checkpoint", "nope.pt"), str(tmp_path / "r.yaml"))


def test_unknown_force_stage() -> None:
    with pytest.raises(RecipeError) as info:
        compose_recipe(["build.force=[exprt]"])
    assert info.value.field == "build.force"
    assert "did you mean 'export'" in info.value.reason


# -- quantize (issue 26) -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("quantize.method", "int3", "quantize.method"),
        ("quantize.block_size", 24, "quantize.block_size"),
        ("quantize.block_size", 8, "quantize.block_size"),
        ("quantize.exclude", [""], "quantize.exclude[0]"),
        ("check.quantized.min_cosine", 1.5, "check.quantized.min_cosine"),
        ("check.quantized.max_rel_error", 0.0, "check.quantized.max_rel_error"),
        ("quantize.accuracy_level", 5, "quantize.accuracy_level"),
        ("check.quantized.min_token_agreement", 1.2, "check.quantized.min_token_agreement"),
        ("check.quantized.min_decode_cosine", -0.1, "check.quantized.min_decode_cosine"),
        ("check.quantized.decode", "warn", "check.quantized.decode"),
    ],
)
def test_bad_quantize_fields_name_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(RecipeError) as info:
        validate_recipe(_with(path, value), "/somewhere/bad.yaml")
    assert info.value.field == field


def test_quantize_defaults_do_nothing() -> None:
    recipe = validate_recipe(_base(), "/somewhere/ok.yaml")
    assert recipe.data["quantize"] == {
        "method": "none",
        "block_size": 32,
        "exclude": [],
        "accuracy_level": 4,
        "symmetric": False,
        "shared_embedding": False,
    }
    assert recipe.data["check"]["quantized"] == {
        "min_cosine": 0.95,
        "max_rel_error": 0.35,
        "min_top1": 0.75,
        "min_token_agreement": 0.85,
        "min_decode_cosine": 0.98,
        "decode": "gate",
    }


def test_torch_2_2_refuses_a_torchscript_opset_above_17_naming_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hyperexport.base import versions

    found = {"torch": "2.2.2", "transformers": "4.57.6"}
    monkeypatch.setattr(versions, "installed_version", lambda name: found.get(name))
    validate_recipe(_with("opset", 17), "/somewhere/ok.yaml")
    with pytest.raises(RecipeError) as info:
        validate_recipe(_with("opset", 18), "/somewhere/bad.yaml")
    assert info.value.field == "opset"
    assert "torch 2.2.2" in str(info.value) and "opset=17" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_decoding_task_on_transformers_4_48_is_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hyperexport.base import versions

    found = {"transformers": "4.48.3"}
    monkeypatch.setattr(versions, "installed_version", lambda name: found.get(name))
    with pytest.raises(RecipeError) as info:
        validate_recipe(_with("task", "text-generation"), "/somewhere/bad.yaml")
    assert info.value.field == "task" and "\n" not in str(info.value)
    assert "transformers 4.48.3" in str(info.value)
    assert f"transformers{versions.DECODING_TASKS_TRANSFORMERS}" in str(info.value)
    validate_recipe(_base(), "/somewhere/ok.yaml")  # task: forward stays open


def test_a_dynamo_recipe_below_the_lowest_working_torch_is_refused_at_validation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hyperexport.base import versions

    found = {"torch": "2.4.1", "transformers": "4.57.6", "onnxscript": "0.6.2"}
    monkeypatch.setattr(versions, "installed_version", lambda name: found.get(name))
    with pytest.raises(RecipeError) as info:
        validate_recipe({**_with("opset", 18), "dynamo": True}, "/somewhere/bad.yaml")
    assert info.value.field == "dynamo"
    assert "torch 2.4.1" in str(info.value) and "torch>=2.6" in str(info.value)


def test_hyperexport_attention_on_transformers_4_48_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hyperexport.base import versions

    found = {"torch": "2.13.0", "transformers": "4.48.3"}
    monkeypatch.setattr(versions, "installed_version", lambda name: found.get(name))
    data = {**_with("attention", {"implementation": "hyperexport"}), "opset": 18}
    with pytest.raises(RecipeError) as info:
        validate_recipe(data, "/somewhere/bad.yaml")
    assert info.value.field == "attention.implementation"
    assert "transformers 4.48.3" in str(info.value)
