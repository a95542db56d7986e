"""``rewrite.fuse`` end to end: recipes built through the real stages with each fusion on both
export paths. The check stage compares the whole model and every call site with torch (the
recipe's tolerance), so a build that passes is a fused model that computes what torch does;
the tests then read which kernels ended up in which function from the manifest and the model."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import onnx
import pytest

from hyperexport.base.contracts.names import is_invariant_input, op_id
from hyperexport.base.versions import attention_interface_reached
from hyperexport.library.passes.ort_kernels import gqa_takes_query_seqlens
from hyperexport.product.config import compose_recipe, validate_recipe
from hyperexport.product.config.schema import Recipe
from tests.helpers.builds import build
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_HYPEREXPORT_ATTENTION,
    NEEDS_OPSET_18,
)

PATHS = [False, True]
PATH_IDS = ["torchscript", "dynamo"]

#: Each test fuses attention exported by hyperexport's own attention, at opset 18 or more.
pytestmark = [NEEDS_HYPEREXPORT_ATTENTION, NEEDS_OPSET_18]


def _recipe(overrides: list[str], expect_ops: dict[str, int]) -> Recipe:
    recipe, _ = compose_recipe(overrides)
    data: dict[str, Any] = json.loads(json.dumps(recipe.data))
    data["check"]["expect_ops"] = expect_ops
    return validate_recipe(data, recipe.file)


def _built(recipe: Recipe, tmp_path: Path) -> tuple[dict[str, Any], onnx.ModelProto]:
    outcome = build(recipe, tmp_path)
    assert outcome.exit_code == 0, outcome.lines
    report = json.loads((outcome.out_dir / "report.json").read_text())
    assert report["check"]["ok"] is True
    manifest = json.loads((outcome.out_dir / "manifest.json").read_text())
    return manifest, onnx.load(str(outcome.model_path), load_external_data=False)


def _executed(per_layer: dict[str, int], layers: int, main: dict[str, int]) -> dict[str, int]:
    """``check.expect_ops``: each layer function's kernels times the layers, plus the main
    graph's own (the model's final norm, BERT's embeddings norm)."""
    return {op: n * layers + main.get(op, 0) for op, n in per_layer.items()}


def _function_ops(model: onnx.ModelProto) -> dict[str, Counter[str]]:
    return {f.name: Counter(op_id(n.domain, n.op_type) for n in f.node) for f in model.functions}


LLAMA_KERNELS = {
    "standard": {"Attention": 1, "RMSNormalization": 2, "RotaryEmbedding": 2},
    # the layer's first norm as SimplifiedLayerNormalization, its MLP's SiLU as QuickGelu
    "onnxruntime": {
        "SimplifiedLayerNormalization": 1,
        "com.microsoft::GroupQueryAttention": 1,
        "com.microsoft::QuickGelu": 1,
        "com.microsoft::RotaryEmbedding": 2,
        "com.microsoft::SkipSimplifiedLayerNormalization": 1,
    },
}


@pytest.mark.parametrize("fusion", sorted(LLAMA_KERNELS))
@pytest.mark.parametrize("dynamo", PATHS, ids=PATH_IDS)
def test_a_llama_fuses_inside_its_one_per_type_function(
    fusion: str, dynamo: bool, tmp_path: Path
) -> None:
    kernels = LLAMA_KERNELS[fusion]
    layers = 2
    recipe = _recipe(
        [
            "recipe=llama_attention",
            f"model.num_layers={layers}",
            "functions=per_type",
            f"dynamo={str(dynamo).lower()}",
            f"rewrite.fuse={fusion}",
        ],
        # both also fuse the model's final RMSNorm, in the main graph.
        _executed(kernels, layers, {"RMSNormalization": 1, "SimplifiedLayerNormalization": 1}),
    )
    manifest, model = _built(recipe, tmp_path)
    assert manifest["fusion"] == fusion
    [entry] = manifest["functions"]  # one layer structure, one function ...
    assert len(manifest["calls"]) == layers  # ... called once per layer
    assert entry["fused_ops"] == kernels
    [layer] = _function_ops(model).values()
    assert {op: layer[op] for op in kernels} == kernels
    opsets = {o.domain: o.version for o in model.opset_import}
    if fusion == "standard":  # portable: ONNX's own ops at opset 24, nothing of ONNX Runtime's
        assert opsets[""] == 24 and "com.microsoft" not in opsets
        assert not any(op.startswith("com.microsoft::") for op in layer)
    else:  # the export opset, ONNX Runtime's kernels
        assert opsets[""] == 18
        # ... on the projections as they come (fuse_layout): no heads moved there and back,
        # every Transpose left is of a weight (a function input).
        [body] = model.functions
        weights = set(body.input)
        moved = [
            n.name for n in body.node if n.op_type == "Transpose" and n.input[0] not in weights
        ]
        assert moved == []
        # query, key and value are one MatMul, and gate and up another (pack_matmuls.py): four
        # with the output and down projections, each output taken apart by a Split.
        assert (layer["MatMul"], layer["Split"]) == (4, 2)


@pytest.mark.parametrize("dynamo", PATHS, ids=PATH_IDS)
def test_gpt2_gets_fast_gelu_and_skip_layer_normalization(dynamo: bool, tmp_path: Path) -> None:
    kernels = {
        "com.microsoft::FastGelu": 1,
        "com.microsoft::GroupQueryAttention": 1,
        "com.microsoft::SkipLayerNormalization": 1,
    }
    recipe = _recipe(
        ["recipe=gpt2", f"dynamo={str(dynamo).lower()}", "rewrite.fuse=onnxruntime"],
        _executed(kernels, 2, {}),
    )
    manifest, _ = _built(recipe, tmp_path)
    assert manifest["fusion"] == "onnxruntime"
    assert [f["fused_ops"] for f in manifest["functions"]] == [kernels, kernels]


@pytest.mark.parametrize("dynamo", PATHS, ids=PATH_IDS)
def test_bert_gets_gelu_skip_layer_normalization_and_multi_head_attention(
    dynamo: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kernels = {
        "com.microsoft::Gelu": 1,
        "com.microsoft::MultiHeadAttention": 1,
        "com.microsoft::SkipLayerNormalization": 2,
    }
    reached = attention_interface_reached("BertModel")
    if not reached:  # transformers 4.x: BERT's attention is plain ops, and stays so
        del kernels["com.microsoft::MultiHeadAttention"]
    recipe = _recipe(
        [
            "recipe=zoo_bert",
            f"dynamo={str(dynamo).lower()}",
            "attention.implementation=hyperexport",
            "rewrite.fuse=onnxruntime",
        ],
        # The embeddings' sum and LayerNorm, in the main graph, fuse too.
        _executed(kernels, 2, {"com.microsoft::SkipLayerNormalization": 1}),
    )
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        manifest, _ = _built(recipe, tmp_path)
    assert [f["fused_ops"] for f in manifest["functions"]] == [kernels, kernels]
    unreached = [r for r in caplog.records if "no attention call of BertModel" in r.message]
    assert bool(unreached) is not reached, caplog.text


GENERATION_KERNELS = {
    "standard": {"Attention": 1, "RMSNormalization": 2, "RotaryEmbedding": 2},
    # the rotations inside GroupQueryAttention (passes/rotary_in_attention.py)
    "onnxruntime": {
        "SimplifiedLayerNormalization": 1,
        "com.microsoft::GroupQueryAttention": 1,
        "com.microsoft::QuickGelu": 1,
        "com.microsoft::SkipSimplifiedLayerNormalization": 1,
    },
}


@pytest.mark.parametrize(
    ("fusion", "dynamo"),
    [
        pytest.param(f, d, marks=[] if (f, d) == ("onnxruntime", False) else [pytest.mark.zoo])
        for f in sorted(GENERATION_KERNELS)
        for d in PATHS
    ],
)
@NEEDS_DECODING_TASKS
def test_the_generation_step_fuses_and_decodes_in_onnxruntime_genai(
    fusion: str, dynamo: bool, tmp_path: Path
) -> None:
    """The decoder layer's step with its KV cache: GroupQueryAttention takes the past as
    past_key/past_value and gives the presents, in onnxruntime-genai's shared buffer with
    ``onnxruntime`` (``passes/share_kv_buffer.py``), so the step function keeps its inputs and
    outputs; onnxruntime-genai decodes the published folder token for token as
    transformers does (the evaluate and check stages), the left-padded batch included."""
    recipe = _recipe(
        [
            "recipe=zoo_llama_generate",
            f"dynamo={str(dynamo).lower()}",
            "attention.implementation=hyperexport",
            f"rewrite.fuse={fusion}",
        ],
        {},
    )
    outcome = build(recipe, tmp_path)
    if fusion == "onnxruntime" and not gqa_takes_query_seqlens():
        # The traced step has batch 2 and 4 new tokens over a past, which this ONNX Runtime's
        # GroupQueryAttention runs only with query_seqlens: refused at rewrite, saying so.
        assert outcome.exit_code == 1 and outcome.report is not None
        assert "takes no query_seqlens" in outcome.report["error"]
        return
    assert outcome.exit_code == 0, outcome.lines
    generation = json.loads((outcome.out_dir / "generation_check.json").read_text())
    assert generation["passed"] and generation["runtime"] == "onnxruntime-genai"
    assert all(s["exported"] == s["reference"] for s in generation["sequences"])
    manifest = json.loads((outcome.out_dir / "manifest.json").read_text())
    [step] = manifest["functions"]
    assert step["fused_ops"] == GENERATION_KERNELS[fusion]
    model = onnx.load(str(outcome.model_path), load_external_data=False)
    [function] = model.functions
    inputs = list(function.input)
    assert len(function.output) == 3
    if fusion == "standard":
        assert inputs[:6] == [
            "hidden_states", "attention_mask", "cos", "sin", "past_key", "past_value"
        ]  # fmt: skip
    else:
        # The attention rotates by constant tables it reads at position_ids, as the builder's
        # (passes/rotary_tables.py): the step takes those for cos and sin, which go, and the
        # main graph computes no rotary embedding per step.
        assert inputs[:5] == [
            "hidden_states", "attention_mask", "past_key", "past_value", "position_ids"
        ]  # fmt: skip
        # the tables last among the weights; what the main graph computes for every layer
        # alike comes in after them (passes/hoist_invariants.py)
        weights = [name for name in inputs if not is_invariant_input(name)]
        assert weights[-2:] == ["rotary_cos_cache", "rotary_sin_cache"]
        tables = [i for i in model.graph.initializer if i.name.startswith("rotary_tables.")]
        assert [list(t.dims) for t in tables] == [[128, 8], [128, 8]]  # context, half a head
        assert not {"Cos", "Sin"} & {n.op_type for n in model.graph.node}
    if fusion == "onnxruntime":
        # Sizes and the bias's type are read off the inputs every layer shares
        # (passes/shared_sizes.py): after inlining, one copy of that arithmetic per step.
        shared = {"attention_mask", "position_ids", "rotary_cos_cache", "rotary_sin_cache"}
        typed = {n.input[1] for n in function.node if n.op_type == "CastLike"}
        sized = {n.input[0] for n in function.node if n.op_type == "Shape"}
        assert typed <= shared
        # or off values computed from those alone (the rotary tables from cos and sin), which
        # after inlining are one copy for every layer too
        derived = set(shared)
        for node in function.node:  # in order: the body is sorted
            if all(i in derived or i == "" for i in node.input):
                derived.update(node.output)
        assert sized <= derived
        # Only the fused causal kernel reads the 4-D mask, and it agrees with the padding mask
        # where causality lets the kernel read (passes/padding_mask.py): the main graph builds
        # the padding mask alone, not transformers' causal one.
        producers = {out: n for n in model.graph.node for out in n.output}
        masks = {n.input[1] for n in model.graph.node if n.op_type == function.name}
        assert [producers[m].name for m in masks] == ["padding_mask_expand"]
        assert not {"Range", "LessOrEqual"} & {n.op_type for n in model.graph.node}
    config = json.loads((outcome.out_dir / "genai_config.json").read_text())
    # onnxruntime: the pasts are onnxruntime-genai's shared buffers (the decode above ran so),
    # the check fed them padded (check/kv_buffer.py); standard: concatenated, as before.
    shared = fusion == "onnxruntime"
    assert config["search"]["past_present_share_buffer"] is shared
    assert config["search"]["max_length"] == config["model"]["context_length"]
    kv = [
        f"past_key_values.{i}.{k}" for i in range(len(manifest["calls"])) for k in ("key", "value")
    ]
    graph_inputs = [i.name for i in model.graph.input]
    expected = (
        {"": [graph_inputs.index(name) for name in kv], function.name: [2, 3]} if shared else None
    )
    assert manifest.get("kv_buffers") == expected
    metadata = {p.key: p.value for p in model.metadata_props}
    assert metadata.get("hyperexport.kv_buffer") == ("shared" if shared else None)
    html = (outcome.out_dir / "report.html").read_text()
    assert ("shared buffers (past_present_share_buffer)" in html) is shared
