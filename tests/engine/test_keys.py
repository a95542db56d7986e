from __future__ import annotations

from typing import Any

from hyperexport.engine.keys import diff_values, explain, key_material, stage_key


def _material(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "stage": "export",
        "version": 1,
        "params": {"opset": 18, "dynamo": False, "check": {"atol": 1e-4}},
        "upstream": {"trace": {"capture.json": "a" * 64}},
        "env": {"python": "3.11", "packages": {"torch": "2.13.0"}},
        "model": {"code": {"transformers": {"version": "5.24.0"}}, "weights": {"seed": 0}},
    }
    base.update(changes)
    return key_material(**base)


def test_key_is_full_sha256_and_order_independent() -> None:
    a = _material(params={"opset": 18, "dynamo": False})
    b = _material(params={"dynamo": False, "opset": 18})
    assert stage_key(a) == stage_key(b)
    assert len(stage_key(a)) == 64


def test_every_part_changes_the_key() -> None:
    base = stage_key(_material())
    assert stage_key(_material(version=2)) != base
    assert stage_key(_material(params={"opset": 17})) != base
    assert stage_key(_material(upstream={"trace": {"capture.json": "b" * 64}})) != base
    assert stage_key(_material(env={"python": "3.11", "packages": {"torch": "2.14.0"}})) != base
    assert stage_key(_material(model={"code": {}, "weights": {"seed": 1}})) != base


def test_reason_names_the_changed_param() -> None:
    old = _material()
    new = _material(params={"opset": 17, "dynamo": False, "check": {"atol": 1e-4}})
    assert explain(old, new) == "opset 18→17"
    new = _material(params={"opset": 18, "dynamo": False, "check": {"atol": 1e-5}})
    assert explain(old, new) == "check.atol 0.0001→1e-05"


def test_reason_for_upstream_env_model_version() -> None:
    old = _material()
    assert explain(old, _material(upstream={"trace": {}})) == "trace output changed"
    env = {"python": "3.11", "packages": {"torch": "2.14.0"}}
    assert explain(old, _material(env=env)) == "torch 2.13.0→2.14.0"
    model = {"code": {"transformers": {"version": "5.25.0"}}, "weights": {"seed": 0}}
    assert explain(old, _material(model=model)) == "model code changed (transformers 5.24.0→5.25.0)"
    dist = {"kind": "dist", "name": "transformers", "version": "5.24.0", "files": "a" * 64}
    before = _material(model={"code": {"transformers": dist}, "weights": {"seed": 0}})
    for change, said in (
        ({"version": "5.25.0"}, "transformers 5.24.0→5.25.0"),
        ({"files": "b" * 64}, "transformers files aaaaaaaa→bbbbbbbb"),  # a local patch
    ):
        after = _material(
            model={"code": {"transformers": {**dist, **change}}, "weights": {"seed": 0}}
        )
        assert explain(before, after) == f"model code changed ({said})"
    assert explain(old, _material(version=2)) == "stage version 1→2"
    assert explain(None, old) == "no previous build"


def test_diff_values_added_removed() -> None:
    assert diff_values({"a": 1}, {"b": 1}) == ["a removed", "b added"]


LAYER = "transformers.models.llama.modeling_llama.LlamaDecoderLayer"
MLP = "transformers.models.llama.modeling_llama.LlamaMLP"


def test_a_list_change_names_its_first_differing_element() -> None:
    """Two long class paths that share a prefix: the reason shows where they part."""
    old = _material(params={"hiera": [LAYER]})
    assert explain(old, _material(params={"hiera": [MLP]})) == (
        "hiera[0] …LlamaDecoderLayer→…LlamaMLP"
    )
    assert explain(old, _material(params={"hiera": [LAYER, MLP]})) == (
        f"hiera[1] added ({MLP[:39]}…)"
    )
    assert explain(_material(params={"hiera": [LAYER, MLP]}), old) == (
        f"hiera[1] removed ({MLP[:39]}…)"
    )
    assert diff_values({"x": [{"a": 1}]}, {"x": [{"a": 2}]}) == ["x[0].a 1→2"]


def test_a_checkpoint_change_names_the_files_up_to_five() -> None:
    files = {f"shard-{i}.safetensors": "a" * 64 for i in range(8)}
    old = _material(model={"files": {"model.path": {**files, "README.md": "r"}}})
    edited = {**{n: "b" * 64 for n in files}, "config.json": "c"}
    new = _material(model={"files": {"model.path": edited}})
    assert explain(old, new) == (
        "files of model.path changed (README.md removed, config.json added, "
        "shard-0.safetensors, shard-1.safetensors, shard-2.safetensors, +5 more)"
    )
