"""FuseOpsPass on small ONNX-text models: which kernels each fusion writes, in which function,
that call sites and function ids stay, that a second run changes nothing, and ONNX Runtime
parity with the unfused model (or with torch, where the unfused model holds the exported
attention node ONNX Runtime cannot run)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir
import pytest
import torch

from hyperexport.base.contracts.names import FUSED_OPS, op_id
from hyperexport.base.errors import RewriteError
from hyperexport.library.options import FUSIONS
from hyperexport.library.passes.fuse_ops import STEPS, FuseOpsPass
from hyperexport.library.passes.ort_kernels import gqa_takes_query_seqlens
from hyperexport.library.transformers.attention_op import attention_reference
from tests.helpers.passes import HEADER, RMS, parse, run_checked

FN = "hyperexport.fn"


def _ops(owner: ir.Graph | ir.Function) -> Counter[str]:
    return Counter(op_id(n.domain, n.op_type) for n in owner if n.op_type != "Constant")


def _calls(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph if n.domain == FN]


def _fuse(
    text: str, fusion: str, feeds: dict[str, np.ndarray], unfused_runs: bool = True
) -> tuple[ir.Model, list[np.ndarray]]:
    """Fuse ``text``; assert parity with the unfused model (when ONNX Runtime runs it), that
    function ids and call sites stay, and that a second run is a no-op. Returns the model and
    its outputs."""
    model = parse(text)
    before = run_checked(model, feeds) if unfused_runs else None
    functions, calls = list(model.functions), _calls(model)
    assert FuseOpsPass(fusion)(model).modified
    assert list(model.functions) == functions
    assert _calls(model) == calls
    after = run_checked(model, feeds)
    if before is not None:
        for b, a in zip(before, after, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    snapshot = ir.to_proto(model).SerializeToString()
    assert not FuseOpsPass(fusion)(model).modified
    assert ir.to_proto(model).SerializeToString() == snapshot
    return model, after


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_every_fusion_but_none_is_declared_and_names_its_ops() -> None:
    assert set(STEPS) == set(FUSED_OPS) == set(FUSIONS) - {"none"}
    with pytest.raises(ValueError, match="fusion must be one of"):
        FuseOpsPass("none")  # type: ignore[arg-type]


# -- RMSNorm -----------------------------------------------------------------------------------


def test_standard_makes_rms_normalization_in_functions_and_main_graph() -> None:
    feeds = {"x": _rand(2, 5, 16), "w": _rand(16, seed=1)}
    model, _ = _fuse(RMS, "standard", feeds)
    [norm] = model.functions.values()
    assert _ops(norm) == {"RMSNormalization": 1}
    assert _ops(model.graph) == {f"{FN}::Norm": 2, "RMSNormalization": 1}
    node = next(n for n in norm if n.op_type == "RMSNormalization")
    assert node.attributes.get_float("epsilon") == pytest.approx(1e-6)
    assert node.attributes.get_int("stash_type") == int(ir.DataType.FLOAT)
    # ONNX's own ops only; the model and every function are declared at opset 24.
    assert model.opset_imports[""] == 24 and norm.opset_imports[""] == 24


def test_onnxruntime_leaves_a_standalone_rms_norm_to_the_last_pass() -> None:
    # load_time_fusions.py writes it, after every pass that reads shapes through the norms
    model = parse(RMS)
    FuseOpsPass("onnxruntime")(model)
    [norm] = model.functions.values()
    assert "ReduceMean" in _ops(norm) and not any("Normalization" in op for op in _ops(norm))


def test_standard_refuses_an_opset_whose_reduce_mean_takes_axes_as_attribute() -> None:
    text = RMS.replace('"" : 18', '"" : 17').replace(
        "mean = ReduceMean <keepdims: int = 1> (sq, axes)",
        "mean = ReduceMean <keepdims: int = 1, axes = [-1]> (sq)",
    )
    with pytest.raises(RewriteError, match="ReduceMean changed meaning at opset 18"):
        FuseOpsPass("standard")(parse(text))


SKIP_RMS = (
    HEADER
    + """
agraph (float[2,5,16] x, float[2,5,16] r, float[16] w) => (float[2,5,16] y, float[2,5,16] s) {
    y, s = hyperexport.fn.Layer (x, r, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Layer (x, r, w) => (out, s) {
    s = Add (x, r)
    two = Constant <value = float {2.0}> ()
    sq = Pow (s, two)
    axes = Constant <value = int64[1] {-1}> ()
    mean = ReduceMean <keepdims: int = 1> (sq, axes)
    eps = Constant <value = float {1e-6}> ()
    var = Add (mean, eps)
    rms = Sqrt (var)
    inv = Reciprocal (rms)
    normed = Mul (inv, s)
    out = Mul (normed, w)
}
"""
)


def test_onnxruntime_makes_skip_simplified_layer_normalization_with_the_sum() -> None:
    feeds = {"x": _rand(2, 5, 16), "r": _rand(2, 5, 16, seed=1), "w": _rand(16, seed=2)}
    model, _ = _fuse(SKIP_RMS, "onnxruntime", feeds)
    [layer] = model.functions.values()
    assert _ops(layer) == {"com.microsoft::SkipSimplifiedLayerNormalization": 1}
    [node] = layer
    assert [o.name for o in layer.outputs] == ["out", "s"]
    assert layer.outputs[1] is node.outputs[3]  # the residual sum, from the kernel
    assert layer.opset_imports["com.microsoft"] == 1


def test_a_skip_whose_operand_ranks_differ_is_not_fused() -> None:
    text = SKIP_RMS.replace("float[2,5,16] r,", "float[16] r,")
    model = parse(text)
    FuseOpsPass("onnxruntime")(model)
    [layer] = model.functions.values()
    assert "com.microsoft::SkipSimplifiedLayerNormalization" not in _ops(layer)


SKIP_LN = (
    HEADER
    + """
agraph (float[2,5,16] a, float[2,5,16] b, float[16] g, float[16] c) => (float[2,5,16] y) {
    y = hyperexport.fn.Block (a, b, g, c)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Block (a, b, g, c) => (out) {
    s = Add (a, b)
    n = LayerNormalization <axis: int = -1, epsilon: float = 1e-5> (s, g, c)
    out = Add (n, s)
}
"""
)


def test_onnxruntime_makes_skip_layer_normalization_with_bias() -> None:
    feeds = {k: _rand(*s, seed=i) for i, (k, s) in enumerate(
        [("a", (2, 5, 16)), ("b", (2, 5, 16)), ("g", (16,)), ("c", (16,))]
    )}  # fmt: skip
    model, _ = _fuse(SKIP_LN, "onnxruntime", feeds)
    [block] = model.functions.values()
    assert _ops(block) == {"com.microsoft::SkipLayerNormalization": 1, "Add": 1}


# -- rotary embeddings -------------------------------------------------------------------------
ROPE = (
    HEADER
    + """
agraph (float[2,4,5,16] x, float[2,5,16] cos, float[2,5,16] sin) => (float[2,4,5,16] y) {
    y = hyperexport.fn.Rope (x, cos, sin)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Rope (x, cos, sin) => (y) {
    zero = Constant <value = int64 {0}> ()
    half = Constant <value = int64 {8}> ()
    end = Constant <value = int64 {9223372036854775807}> ()
    axis = Constant <value = int64 {3}> ()
    at0 = Constant <value = int64[1] {0}> ()
    s0 = Unsqueeze (zero, at0)
    h0 = Unsqueeze (half, at0)
    e0 = Unsqueeze (end, at0)
    a0 = Unsqueeze (axis, at0)
    first = Slice (x, s0, h0, a0)
    second = Slice (x, h0, e0, a0)
    minus = Neg (second)
    rotated = Concat <axis: int = -1> (minus, first)
    one = Constant <value = int64[1] {1}> ()
    c4 = Unsqueeze (cos, one)
    s4 = Unsqueeze (sin, one)
    a = Mul (x, c4)
    b = Mul (rotated, s4)
    y = Add (a, b)
}
"""
)


def _rope_feeds() -> dict[str, np.ndarray]:
    freqs = np.random.default_rng(1).random((2, 5, 8)).astype(np.float32) * 3
    table = np.concatenate([freqs, freqs], axis=-1)  # transformers' cat(freqs, freqs)
    return {"x": _rand(2, 4, 5, 16), "cos": np.cos(table), "sin": np.sin(table)}


@pytest.mark.parametrize(
    ("fusion", "kernel"),
    [("standard", "RotaryEmbedding"), ("onnxruntime", "com.microsoft::RotaryEmbedding")],
)
def test_rotate_half_becomes_rotary_embedding(fusion: str, kernel: str) -> None:
    model, _ = _fuse(ROPE, fusion, _rope_feeds())
    [rope] = model.functions.values()
    assert _ops(rope)[kernel] == 1
    assert not {"Neg", "Concat"} & set(_ops(rope))


def test_rotate_half_of_another_split_is_not_fused() -> None:
    text = ROPE.replace("<value = int64 {8}>", "<value = int64 {6}>")
    model = parse(text)
    FuseOpsPass("onnxruntime")(model)
    [rope] = model.functions.values()
    assert "com.microsoft::RotaryEmbedding" not in _ops(rope)


# -- attention ---------------------------------------------------------------------------------
ATTENTION = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
agraph (float[2,4,6,8] q, float[2,2,6,8] k, float[2,2,6,8] v, bool[2,1,6,6] m) => (float[2,4,6,8] y) {
    y = hyperexport.fn.Attend (q, k, v, m)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.attention" : 1]>
Attend (q, k, v, m) => (out) {
    a = hyperexport.attention.Attention <is_causal: int = 0, scale: float = 0.3, causal_hint: int = 1> (q, k, v, m)
    out = Relu (a)
}
"""


def _attention_feeds(heads: int = 2, window: int = 3) -> dict[str, np.ndarray]:
    # A sliding causal window (Mistral's): a mask the kernel's own causal mask keeps whole.
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    mask = (j <= i) & (i - j < window)
    return {
        "q": _rand(2, 4, 6, 8, seed=1),
        "k": _rand(2, heads, 6, 8, seed=2),
        "v": _rand(2, heads, 6, 8, seed=3),
        "m": np.broadcast_to(mask, (2, 1, 6, 6)).copy(),
    }


def _reference(feeds: dict[str, np.ndarray], **kw: object) -> np.ndarray:
    tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
    out = attention_reference(tensors["q"], tensors["k"], tensors["v"], tensors.get("m"), **kw)
    return torch.relu(out).numpy()


def test_causal_attention_becomes_group_query_attention() -> None:
    feeds = _attention_feeds()
    model, (got,) = _fuse(ATTENTION, "onnxruntime", feeds, unfused_runs=False)
    [attend] = model.functions.values()
    assert _ops(attend)["com.microsoft::GroupQueryAttention"] == 1
    node = next(n for n in attend if n.op_type == "GroupQueryAttention")
    assert node.attributes.get_int("num_heads") == 4
    assert node.attributes.get_int("kv_num_heads") == 2
    assert node.attributes.get_float("scale") == pytest.approx(0.3)
    np.testing.assert_allclose(got, _reference(feeds, scale=0.3), atol=1e-5)


def test_is_causal_without_mask_becomes_group_query_attention() -> None:
    text = ATTENTION.replace(
        "<is_causal: int = 0, scale: float = 0.3, causal_hint: int = 1> (q, k, v, m)",
        "<is_causal: int = 1, scale: float = 0.3> (q, k, v)",
    )
    feeds = _attention_feeds()  # the mask is an input the node no longer reads
    model, (got,) = _fuse(text, "onnxruntime", feeds, unfused_runs=False)
    [attend] = model.functions.values()
    assert _ops(attend)["com.microsoft::GroupQueryAttention"] == 1
    unmasked = {k: v for k, v in feeds.items() if k != "m"}
    expected = _reference(unmasked, is_causal=True, scale=0.3)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_attention_without_causality_becomes_multi_head_attention() -> None:
    text = ATTENTION.replace(", causal_hint: int = 1", "").replace(
        "float[2,2,6,8]", "float[2,4,6,8]"
    )
    feeds = _attention_feeds(heads=4)
    feeds["m"] = np.random.default_rng(5).random((2, 1, 6, 6)) > 0.3
    feeds["m"][..., 0] = True  # no row without a key
    model, (got,) = _fuse(text, "onnxruntime", feeds, unfused_runs=False)
    [attend] = model.functions.values()
    assert _ops(attend)["com.microsoft::MultiHeadAttention"] == 1
    np.testing.assert_allclose(got, _reference(feeds, scale=0.3), atol=1e-5)


def test_standard_promotes_attention_and_drops_the_hint() -> None:
    feeds = _attention_feeds()
    model, (got,) = _fuse(ATTENTION, "standard", feeds, unfused_runs=False)
    [attend] = model.functions.values()
    [node] = [n for n in attend if n.op_type == "Attention"]
    assert node.domain == "" and "causal_hint" not in node.attributes
    np.testing.assert_allclose(got, _reference(feeds, scale=0.3), atol=1e-5)


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (", causal_hint: int = 1", "", "4 query heads on 2 key heads without causality"),
        ("is_causal: int = 0,", "is_causal: int = 0, softcap: float = 5.0,", None),
        ("float[2,4,6,8] q", "float[2,4,5,8] q", "a causal call whose query and key lengths"),
        ("bool[2,1,6,6] m", "float[2,6,6] m", "the mask has rank 3"),
    ],
)
def test_attention_onnx_runtime_cannot_run_is_refused_with_the_reason(
    old: str, new: str, reason: str | None
) -> None:
    model = parse(ATTENTION.replace(old, new))
    if reason is None:  # softcap with causality, and shorter queries with a mask, do fuse
        assert FuseOpsPass("onnxruntime")(model).modified
        return
    with pytest.raises(RewriteError, match=f"function Attend has no ONNX Runtime kernel: {reason}"):
        FuseOpsPass("onnxruntime")(model)


CACHED = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
agraph (float[2,4,2,8] q, float[2,2,2,8] k, float[2,2,2,8] v, float[2,2,3,8] pk, float[2,2,3,8] pv, bool[2,1,2,5] m)
    => (float[2,4,2,8] y, float[2,2,5,8] ok, float[2,2,5,8] ov) {
    y, ok, ov = hyperexport.fn.Step (q, k, v, pk, pv, m)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.attention" : 1]>
Step (q, k, v, pk, pv, m) => (out, kk, vv) {
    kk = Concat <axis: int = -2> (pk, k)
    vv = Concat <axis: int = 2> (pv, v)
    out = hyperexport.attention.Attention <is_causal: int = 0, scale: float = 0.3, causal_hint: int = 1> (q, kk, vv, m)
}
"""


def test_attention_over_a_kv_cache_takes_the_past_as_past_key_and_value() -> None:
    i, j = np.arange(2)[:, None] + 3, np.arange(5)[None, :]  # queries at positions 3, 4
    mask = np.broadcast_to(j <= i, (2, 1, 2, 5)).copy()
    mask[1, ..., 0] = False  # the second row's first key is padding
    feeds = {
        "q": _rand(2, 4, 2, 8, seed=1), "k": _rand(2, 2, 2, 8, seed=2),
        "v": _rand(2, 2, 2, 8, seed=3), "pk": _rand(2, 2, 3, 8, seed=4),
        "pv": _rand(2, 2, 3, 8, seed=5), "m": mask,
    }  # fmt: skip
    if not gqa_takes_query_seqlens():  # an ONNX Runtime without it: refused, with the reason
        with pytest.raises(RewriteError, match="takes no query_seqlens"):
            FuseOpsPass("onnxruntime")(parse(CACHED))
        return
    model, (out, present_k, present_v) = _fuse(CACHED, "onnxruntime", feeds, unfused_runs=False)
    [step] = model.functions.values()
    assert _ops(step)["com.microsoft::GroupQueryAttention"] == 1 and "Concat" not in _ops(step)
    k = np.concatenate([feeds["pk"], feeds["k"]], axis=2)
    v = np.concatenate([feeds["pv"], feeds["v"]], axis=2)
    np.testing.assert_array_equal(present_k, k)
    np.testing.assert_array_equal(present_v, v)
    tensors = [torch.from_numpy(x) for x in (feeds["q"], k, v, mask)]
    expected = attention_reference(*tensors, scale=0.3).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_without_query_seqlens_attention_over_a_cache_is_refused_naming_that_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where GroupQueryAttention takes no query_seqlens (ONNX Runtime 1.31), the cached rule
    refuses the node first and the uncached rules refuse it for a reason of theirs; the refusal
    names the cause (the floors leg at cd56fb8 named the uncached rule's). Run on every
    ONNX Runtime by answering for the kernel."""
    from hyperexport.library.passes import fuse_attention

    monkeypatch.setattr(fuse_attention, "gqa_takes_query_seqlens", lambda: False)
    with pytest.raises(RewriteError, match="takes no query_seqlens") as caught:
        FuseOpsPass("onnxruntime")(parse(CACHED))
    assert "function Step has no ONNX Runtime kernel: keys from a cache" in str(caught.value)


# -- GELU --------------------------------------------------------------------------------------
def _gelu_model(body: str) -> str:
    return (
        HEADER
        + """
agraph (float[2,5,16] x) => (float[2,5,16] y) {
    y = hyperexport.fn.Act (x)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Act (x) => (y) {
    half = Constant <value = float {0.5}> ()
    one = Constant <value = float {1.0}> ()
"""
        + body
        + "\n}\n"
    )


TANH = """
    three = Constant <value = float {3.0}> ()
    k = Constant <value = float {0.044715}> ()
    c = Constant <value = float {0.7978845608}> ()
    p = Pow (x, three)
    pk = Mul (k, p)
    s = Add (x, pk)
    sc = Mul (s, c)
    t = Tanh (sc)
    t1 = Add (t, one)
"""
ERF = """
    root = Constant <value = float {1.4142135623730951}> ()
    d = Div (x, root)
    e = Erf (d)
    t1 = Add (one, e)
"""
OUTER = {
    "half_x": "hx = Mul (half, x)\n    y = Mul (hx, t1)",
    "half_inner": "ht = Mul (t1, half)\n    y = Mul (x, ht)",
    "inner_half": "xt = Mul (t1, x)\n    y = Mul (xt, half)",
}


@pytest.mark.parametrize("outer", sorted(OUTER))
@pytest.mark.parametrize(("inner", "kernel"), [(TANH, "FastGelu"), (ERF, "Gelu")])
def test_gelu_in_every_association_becomes_its_kernel(inner: str, kernel: str, outer: str) -> None:
    model, _ = _fuse(_gelu_model(inner + OUTER[outer]), "onnxruntime", {"x": _rand(2, 5, 16)})
    [act] = model.functions.values()
    assert _ops(act) == {f"com.microsoft::{kernel}": 1}


def test_quick_gelu_keeps_its_alpha() -> None:
    body = "a = Constant <value = float {1.702}> ()\n    ax = Mul (a, x)\n    g = Sigmoid (ax)\n"
    model, _ = _fuse(
        _gelu_model(body + "    y = Mul (g, x)"), "onnxruntime", {"x": _rand(2, 5, 16)}
    )
    [act] = model.functions.values()
    [node] = [n for n in act if n.op_type == "QuickGelu"]
    assert node.attributes.get_float("alpha") == pytest.approx(1.702)


def test_a_gelu_with_other_constants_is_left_alone() -> None:
    text = _gelu_model(TANH.replace("0.044715", "0.05") + OUTER["half_x"])
    model = parse(text)
    FuseOpsPass("onnxruntime")(model)
    [act] = model.functions.values()
    assert "com.microsoft::FastGelu" not in _ops(act) and "Tanh" in _ops(act)


def test_a_model_with_nothing_to_fuse_is_not_modified() -> None:
    text = _gelu_model("    y = Relu (x)")
    model = parse(text)
    assert not FuseOpsPass("onnxruntime")(model).modified
