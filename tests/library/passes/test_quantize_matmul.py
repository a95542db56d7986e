"""QuantizeMatMulsPass: MatMuls inside functions become ORT's quantized ops; functions stay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.library.model_file import load_model, save_external
from hyperexport.library.passes.quantize_matmul import QUANTIZED_OPS, QuantizeMatMulsPass
from hyperexport.library.passes.quantize_weights import (
    INT4_BLOCK,
    INT8_CODE_MAX,
    INT8_DYNAMIC,
    dequantize_int4_blocks,
    dequantize_int8_columns,
    quantize_int4_blocks,
    quantize_int8_columns,
)
from tests.helpers.matmul_models import (
    FN,
    PER_INSTANCE,
    PER_TYPE,
    add_weights,
    bake,
    op_counts,
    run_checked,
    x_feed,
)
from tests.helpers.passes import parse


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _dequantized(method: str, w_nk: np.ndarray, symmetric: bool = False) -> np.ndarray:
    """The [N, K] weight the quantized op stands for (computed independently of the pass)."""
    if method == INT4_BLOCK:
        return dequantize_int4_blocks(quantize_int4_blocks(w_nk, 32, symmetric))
    return dequantize_int8_columns(quantize_int8_columns(w_nk.T)).T


#: Expected relative error against float on standard-normal weights and inputs: 4-bit codes
#: over a block's range give ~8%; 8-bit per column, weights and activations, ~1%.
FLOAT_BOUND = {INT4_BLOCK: 0.12, INT8_DYNAMIC: 0.03}


@pytest.mark.parametrize("method", [INT4_BLOCK, INT8_DYNAMIC])
def test_per_type_quantizes_inside_the_shared_body(method: str) -> None:
    model = parse(PER_TYPE)
    weights = add_weights(model, ["w0", "w1", "w2"])
    before = run_checked(model, x_feed())[0]
    idents = set(model.functions)

    # accuracy_level 0: float activations, so the result is the dequantized weights' product.
    assert QuantizeMatMulsPass(method, block_size=32, accuracy_level=0)(model).modified

    ops = op_counts(model)
    op = QUANTIZED_OPS[method]
    assert set(model.functions) == idents  # functions stay functions, same ids
    assert ops["Inner"][op] == 1 and ops["Inner"]["MatMul"] == 0 and ops["Inner"]["Transpose"] == 0
    assert ops["main"]["Outer"] == 3  # still one function, three calls
    inner = model.functions[(FN, "Inner", "")]
    assert [v.name for v in inner.inputs][:1] == ["u"] and len(
        inner.inputs
    ) == 4  # u, q, scales, zp
    assert not {"w0", "w1", "w2"} & set(model.graph.initializers)  # float weights are gone
    after = run_checked(model, x_feed())[0]
    x = np.maximum(x_feed()["x"], 0)
    expected = sum(x @ _dequantized(method, w).T for w in weights.values())
    assert _rel(after, expected) < (1e-5 if method == INT4_BLOCK else 0.01)
    assert _rel(after, before) < FLOAT_BOUND[method]
    assert not QuantizeMatMulsPass(method, block_size=32)(model).modified


@pytest.mark.parametrize("method", [INT4_BLOCK, INT8_DYNAMIC])
def test_per_instance_quantizes_baked_weights_and_main_graph(method: str) -> None:
    model = parse(PER_INSTANCE)
    head = add_weights(model, ["lm_head.weight"])["lm_head.weight"]
    baked = bake(model)
    before = run_checked(model, x_feed())[0]

    assert QuantizeMatMulsPass(method, block_size=32, accuracy_level=0)(model).modified

    ops = op_counts(model)
    op = QUANTIZED_OPS[method]
    assert ops["Layer_0"][op] == ops["Layer_1"][op] == ops["main"][op] == 1
    assert sum(c["MatMul"] for c in ops.values()) == 0
    assert len(model.functions) == 2 and ops["main"]["Layer_0"] == ops["main"]["Layer_1"] == 1
    after = run_checked(model, x_feed())[0]
    h = x_feed()["x"] @ _dequantized(method, baked["Layer_0"]).T  # Transpose of an [N, K] weight
    h = h @ _dequantized(method, baked["Layer_1"].T).T  # a [K, N] weight as it is
    expected = h @ _dequantized(method, head).T
    assert _rel(after, expected) < (1e-5 if method == INT4_BLOCK else 0.02)
    assert _rel(after, before) < 2 * FLOAT_BOUND[method]
    assert not QuantizeMatMulsPass(method, block_size=32)(model).modified


def test_symmetric_blocks_have_no_zero_points_and_run_as_dequantized() -> None:
    """``symmetric``: two quantized inputs per weight (codes, scales); ONNX Runtime's implicit
    zero point 8 gives exactly the dequantized weights' product, inside the shared body."""
    model = parse(PER_TYPE)
    weights = add_weights(model, ["w0", "w1", "w2"])
    before = run_checked(model, x_feed())[0]
    assert QuantizeMatMulsPass(INT4_BLOCK, 32, accuracy_level=0, symmetric=True)(model).modified
    inner = model.functions[(FN, "Inner", "")]
    [nbits] = [n for n in inner.graph if n.op_type == "MatMulNBits"]
    assert len(nbits.inputs) == 3  # A, B, scales
    assert [v.name for v in inner.inputs][1:] == ["weight.q4", "weight.q4_scales"]
    assert not any(name.endswith("zero_points") for name in model.graph.initializers)
    after = run_checked(model, x_feed())[0]
    x = np.maximum(x_feed()["x"], 0)
    expected = sum(x @ _dequantized(INT4_BLOCK, w, symmetric=True).T for w in weights.values())
    assert _rel(after, expected) < 1e-5
    assert _rel(after, before) < FLOAT_BOUND[INT4_BLOCK]


@pytest.mark.parametrize("level", [4, 0])
def test_accuracy_level_is_set_on_matmul_nbits(level: int) -> None:
    """The builder's CPU level by default (int8 activations: a little more error than float
    activations, which level 0, ONNX Runtime's default, keeps by leaving the attribute out)."""
    model = parse(PER_TYPE)
    weights = add_weights(model, ["w0", "w1", "w2"])
    assert QuantizeMatMulsPass(INT4_BLOCK, 32, accuracy_level=level)(model).modified
    nbits = [n for n in model.functions[(FN, "Inner", "")].graph if n.op_type == "MatMulNBits"]
    assert len(nbits) == 1
    attribute = nbits[0].attributes.get("accuracy_level")
    assert (attribute.as_int() if attribute is not None else 0) == level
    assert (attribute is None) == (level == 0)
    after = run_checked(model, x_feed())[0]
    x = np.maximum(x_feed()["x"], 0)
    expected = sum(x @ _dequantized(INT4_BLOCK, w).T for w in weights.values())
    assert _rel(after, expected) < (0.02 if level else 1e-5)


def test_int8_codes_never_saturate_the_int16_pair_sums_of_x86_without_vnni() -> None:
    """ONNX Runtime multiplies uint8 activations by int8 weights with ``pmaddubsw`` on x86 CPUs
    without VNNI: two products summed into a saturating int16. Full 8-bit codes overflow it
    (the per_instance test above was 13% off on an AVX2 EPYC); the reduced range does not."""
    weight = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    codes = quantize_int8_columns(weight).weight
    assert int(np.abs(codes).max()) == INT8_CODE_MAX  # each column's largest weight hits the end
    assert np.iinfo(np.int16).max >= 2 * 255 * INT8_CODE_MAX


def test_int8_stays_accurate_on_activations_that_fill_the_uint8_range() -> None:
    """The worst case of the saturation: activations quantized near 255 at both elements of a
    pair, weights at the ends of their range. The answer must not depend on the CPU."""
    model = parse(PER_TYPE)
    weights = add_weights(model, ["w0", "w1", "w2"])
    for w in weights.values():  # large positive weights: products that add up in each pair
        w[...] = np.abs(w) + 1.0
    assert QuantizeMatMulsPass(INT8_DYNAMIC)(model).modified
    # Relu keeps what is positive: all activations large and positive, so they quantize to
    # codes near 255 (the zero point at 0).
    feed = {"x": np.full((2, 3, 64), 3.0, dtype=np.float32)}
    feed["x"][..., ::7] = 2.9
    after = run_checked(model, feed)[0]
    expected = sum(
        np.maximum(feed["x"], 0) @ _dequantized(INT8_DYNAMIC, w).T for w in weights.values()
    )
    assert _rel(after, expected) < 0.01


def test_exclude_by_module_path_and_function_name() -> None:
    model = parse(PER_INSTANCE)
    add_weights(model, ["lm_head.weight"])
    bake(model)
    before = run_checked(model, x_feed())[0]

    assert QuantizeMatMulsPass(INT4_BLOCK, exclude=("lm_head", "Layer_1"))(model).modified
    ops = op_counts(model)
    assert ops["Layer_0"]["MatMulNBits"] == 1
    assert ops["Layer_1"]["MatMul"] == 1 and ops["main"]["MatMul"] == 1
    assert "lm_head.weight" in model.graph.initializers
    assert _rel(run_checked(model, x_feed())[0], before) < FLOAT_BOUND[INT4_BLOCK]


def test_exclude_by_module_path_of_a_baked_weight() -> None:
    model = parse(PER_INSTANCE)
    add_weights(model, ["lm_head.weight"])
    bake(model)  # Layer_0's module path is "Layers.0"
    QuantizeMatMulsPass(INT4_BLOCK, exclude=("Layers.0",))(model)
    ops = op_counts(model)
    assert ops["Layer_0"]["MatMul"] == 1 and ops["Layer_1"]["MatMulNBits"] == 1


def test_per_type_call_site_excluded_keeps_the_shared_body_float() -> None:
    model = parse(PER_TYPE)
    add_weights(model, ["w0", "w1", "w2"])
    assert not QuantizeMatMulsPass(INT4_BLOCK, exclude=("w1",))(model).modified
    assert op_counts(model)["Inner"]["MatMul"] == 1


def test_weight_that_is_data_at_one_call_site_stays_float() -> None:
    model = parse(PER_TYPE)
    add_weights(model, ["w0", "w2"])  # w1 stays a graph input: not a constant
    assert not QuantizeMatMulsPass(INT4_BLOCK)(model).modified
    assert op_counts(model)["Inner"]["MatMul"] == 1


def test_block_size_must_be_a_power_of_two_from_16() -> None:
    for bad in (8, 24, 100):
        with pytest.raises(ValueError, match="power of two"):
            QuantizeMatMulsPass(INT4_BLOCK, block_size=bad)
    with pytest.raises(ValueError, match="int4_block"):
        QuantizeMatMulsPass("int3")


def test_block_size_that_does_not_divide_k_pads() -> None:
    w = np.random.default_rng(3).standard_normal((5, 40)).astype(np.float32)
    q = quantize_int4_blocks(w, 32)
    assert q.packed.shape == (5, 2, 16) and q.scales.shape == (10,) and q.zero_points.shape == (5,)
    assert _rel(dequantize_int4_blocks(q), w) < 0.12


def _int4_one_block_at_a_time(w_nk: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """The module docstring's int4 layout, computed block by block with nothing shared."""
    n, k = w_nk.shape
    blocks = -(-k // block_size)
    packed = np.zeros((n, blocks, block_size // 2), np.uint8)
    scales = np.zeros((n, blocks), w_nk.dtype)
    zeros = np.zeros((n, blocks + blocks % 2), np.uint8)
    for row in range(n):
        for b in range(blocks):
            block = np.zeros(block_size, np.float32)
            part = w_nk[row, b * block_size : (b + 1) * block_size].astype(np.float32)
            block[: len(part)] = part
            low, high = min(block.min(), np.float32(0)), max(block.max(), np.float32(0))
            scale = (high - low) / np.float32(15)
            safe = scale if scale != 0 else np.float32(1)
            zero = np.clip(np.rint(-low / safe), 0, 15)
            codes = np.clip(np.rint(block / safe) + zero, 0, 15).astype(np.uint8)
            packed[row, b] = codes[0::2] | (codes[1::2] << 4)
            scales[row, b] = scale
            zeros[row, b] = zero
    return packed, scales.reshape(-1), (zeros[:, 0::2] | (zeros[:, 1::2] << 4)).reshape(-1)


@pytest.mark.parametrize("layout", ["matmul_b_view", "contiguous_nk"])
@pytest.mark.parametrize("chunk", [1 << 18, 64])
def test_int4_chunks_and_threads_give_the_same_bytes_as_one_block_at_a_time(
    layout: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ml_dtypes

    from hyperexport.library.passes import quantize_weights

    monkeypatch.setattr(quantize_weights, "_CHUNK_ELEMENTS", chunk)  # 64: a chunk per block
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    rng = np.random.default_rng(7)
    for dtype in (np.float32, ml_dtypes.bfloat16):
        # K = 72: two whole blocks of 32 and a padded one; an all-zero column block.
        kn = rng.standard_normal((72, 24)).astype(dtype)
        kn[32:64, 5] = 0
        w_nk = kn.T if layout == "matmul_b_view" else np.ascontiguousarray(kn.T)
        q = quantize_int4_blocks(w_nk, 32)
        expected = _int4_one_block_at_a_time(np.ascontiguousarray(kn.T), 32)
        for got, want in zip((q.packed, q.scales, q.zero_points), expected, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def _unpacked(packed: np.ndarray) -> np.ndarray:
    """``[N, blocks, half]`` uint8 pairs as ``[N, blocks * 2 * half]`` codes, low nibble first."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1)
    return codes.reshape(packed.shape[0], -1)


def test_int4_blocks_agree_with_onnxruntimes_own_quantizer() -> None:
    """The layout and the numbers of ONNX Runtime's ``MatMulNBitsQuantizer`` (its C++
    ``quantize_matmul_4bits``, asymmetric): the same scales, the same codes but for halfway
    cases the two round apart, and zero points within one step; what neither reads (the
    padding's codes, the last zero point's spare nibble) may differ."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    rng = np.random.default_rng(11)
    for k, n in ((256, 96), (72, 40)):  # K padded to whole blocks in the second
        kn = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        ours = quantize_int4_blocks(kn.T, 32)
        blocks = -(-k // 32)
        packed = np.zeros((n, blocks, 16), dtype=np.uint8)
        zeros = np.zeros((n, (blocks + 1) // 2), dtype=np.uint8)
        scales = np.zeros((n, blocks), dtype=np.float32)
        quantize_matmul_4bits(packed, kn, scales, zeros, 32, n, k, False)
        np.testing.assert_allclose(ours.scales, scales.reshape(-1), rtol=1e-6)
        # The codes of K's own elements (the padding's are never read).
        same = np.mean(_unpacked(ours.packed)[:, :k] == _unpacked(packed)[:, :k])
        assert same > 0.999, same
        # The zero points of the blocks (an odd count leaves a nibble unread: ORT writes 8 there).
        z_ours = _unpacked(ours.zero_points.reshape(n, 1, -1))[:, :blocks].astype(int)
        z_ort = _unpacked(zeros.reshape(n, 1, -1))[:, :blocks].astype(int)
        assert np.max(np.abs(z_ours - z_ort)) <= 1


def test_symmetric_int4_blocks_are_onnxruntimes_own() -> None:
    """Symmetric blocks as ONNX Runtime's ``quantize_matmul_4bits`` with ``is_symmetric`` makes
    them (the builder's): the same scales and codes, in both layouts the pass cuts."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    rng = np.random.default_rng(12)
    for k, n in ((256, 96), (72, 40)):
        kn = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
        kn[:32, 0] = np.abs(kn[:32, 0])  # a block on one side of zero: its sign decides the scale
        for ours in (
            quantize_int4_blocks(kn.T, 32, symmetric=True),
            quantize_int4_blocks(np.ascontiguousarray(kn.T), 32, symmetric=True),
        ):
            assert ours.zero_points is None and len(ours.arrays()) == 2
            blocks = -(-k // 32)
            packed = np.zeros((n, blocks, 16), dtype=np.uint8)
            zeros = np.zeros((n, (blocks + 1) // 2), dtype=np.uint8)
            scales = np.zeros((n, blocks), dtype=np.float32)
            quantize_matmul_4bits(packed, kn, scales, zeros, 32, n, k, True)
            np.testing.assert_array_equal(ours.scales, scales.reshape(-1))
            same = np.mean(_unpacked(ours.packed)[:, :k] == _unpacked(packed)[:, :k])
            assert same > 0.999, same


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_each_float_weight_is_unmapped_once_quantized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float weight read from a data file is unmapped as soon as it is quantized: all of a 1B
    model's weights would otherwise be resident at once by the end of the pass."""
    import hyperexport.library.passes.quantize_matmul as quantize_matmul

    model = parse(PER_INSTANCE)
    add_weights(model, ["lm_head.weight"])
    bake(model)
    save_external(model, tmp_path / "model.onnx", threshold=0)
    loaded = load_model(tmp_path / "model.onnx")
    data = str(tmp_path / "model.onnx.data")
    seen: list[int] = []
    real = quantize_matmul.quantize_int4_blocks

    def counting(*args: object, **kwargs: object) -> object:
        seen.append(
            sum(1 for line in Path("/proc/self/maps").read_text().splitlines() if data in line)
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(quantize_matmul, "quantize_int4_blocks", counting)
    assert QuantizeMatMulsPass(INT4_BLOCK, block_size=32)(loaded).modified
    assert len(seen) == 3 and max(seen) == 1, seen  # the weight being quantized, alone


#: Tied embeddings in the main graph: the table gathered by token, and read again, transposed,
#: as ``lm_head``'s weight (``table`` is made an initializer by :func:`_tied`).
TIED = """
<ir_version: 10, opset_import: ["" : 21]>
tied (int64[1, 5] ids) => (float[1, 5, {h}] emb, float[1, 5, {v}] logits) {{
    emb = Gather <axis = 0> (table, ids)
    t = Transpose <perm = [1, 0]> (table)
    logits = MatMul (emb, t)
}}
"""


def _tied(hidden: int, vocab: int = 40) -> tuple[ir.Model, np.ndarray]:
    model = parse(TIED.format(h=hidden, v=vocab))
    table = np.random.default_rng(0).standard_normal((vocab, hidden)).astype(np.float32)
    made = ir.Value(name="table", const_value=ir.Tensor(table, name="table"))
    made.type, made.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(table.shape)
    model.graph.register_initializer(made)
    for node in model.graph:
        for i, v in enumerate(node.inputs):
            if v is not None and v.name == "table" and v is not made:
                node.replace_input_with(i, made)
    return model, table


@pytest.mark.parametrize(("hidden", "symmetric"), [(64, True), (64, False), (48, True)])
def test_a_shared_embedding_gathers_lm_heads_int4_rows(hidden: int, symmetric: bool) -> None:
    model, table = _tied(hidden)
    ids = np.array([[0, 7, 39, 7, 12]], np.int64)
    shared = QuantizeMatMulsPass(
        INT4_BLOCK, 32, accuracy_level=0, symmetric=symmetric, shared_embedding=True
    )
    assert shared(model).modified
    ops = op_counts(model)["main"]
    assert ops["GatherBlockQuantized"] == 1 and ops["Gather"] == 0
    assert ops["Slice"] == (1 if hidden % 32 else 0)  # K padded to whole blocks: sliced back
    assert "table" not in model.graph.initializers  # the float table left the model
    emb, logits = run_checked(model, {"ids": ids})
    rows = _dequantized(INT4_BLOCK, table, symmetric)
    np.testing.assert_array_equal(emb[0], rows[ids[0]])  # exactly lm_head's int4 rows
    np.testing.assert_allclose(logits[0], emb[0] @ rows.T, rtol=1e-4, atol=1e-4)


def test_without_shared_embedding_the_table_stays_float() -> None:
    model, _ = _tied(64)
    assert QuantizeMatMulsPass(INT4_BLOCK, 32, accuracy_level=0)(model).modified
    assert op_counts(model)["main"]["Gather"] == 1
    assert "table" in model.graph.initializers


def test_shared_embedding_needs_int4_blocks() -> None:
    with pytest.raises(ValueError, match="shared_embedding needs int4_block"):
        QuantizeMatMulsPass(INT8_DYNAMIC, shared_embedding=True)
