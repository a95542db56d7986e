"""Fusion rules for normalisations: RMSNorm as ONNX ``RMSNormalization`` (opset 23), and a
residual ``Add`` feeding an RMSNorm or a ``LayerNormalization`` as ONNX Runtime's
``SkipSimplifiedLayerNormalization``/``SkipLayerNormalization`` (``com.microsoft``).

The RMSNorm subgraph is transformers' ``x * rsqrt(mean(x**2, -1) + eps) * weight``, as both
export paths write it: ``Pow``, ``ReduceMean`` (axes as input or attribute), ``Add``, ``Sqrt``
and ``Reciprocal`` (dynamo) or ``Div(1, .)`` (TorchScript), then the two ``Mul``; a ``Cast`` to
the compute type may stand before and after the normalisation (half-precision models).

A standalone RMSNorm becomes ONNX Runtime's ``SimplifiedLayerNormalization``, as the builder
writes it, last (``load_time_fusions.py``): ONNX Runtime would fuse the subgraph itself when it
loads the model, but a session that fused anything at load runs the same final graph slower
than one that found nothing left to do (``bench/README.md``). The op lives in the default
domain, where onnx's checker knows no such op: the check stage's checker is told its schema for
a model the ``onnxruntime`` fusion made (``check/onnxruntime_schemas.py``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern

from hyperexport.library.passes.fuse_values import ints, rank, scalar

MS_DOMAIN = "com.microsoft"
_FLOAT_STASH = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


@dataclass(frozen=True)
class RmsForm:
    """How an exporter wrote the RMSNorm: ``Div(1, .)`` or ``Reciprocal``; which operand of each
    product comes first (constants come second: the fusion puts them there first); a ``Cast``
    to the compute type before it and back after it (half-precision models; no-op casts of
    full-precision ones are gone before the rules run)."""

    div: bool
    x_first: bool
    scale_first: bool
    cast_in: bool
    cast_out: bool

    @property
    def name(self) -> str:
        flags = ("Div" if self.div else "Reciprocal", "XFirst" * self.x_first)
        more = ("ScaleFirst" * self.scale_first, "CastIn" * self.cast_in, "CastOut" * self.cast_out)
        return "".join(flags + more)


RMS_FORMS = tuple(RmsForm(*flags) for flags in itertools.product((True, False), repeat=5))


def _rms_pattern(
    op: Any, x: Any, scale: Any, exponent: Any, epsilon: Any, one: Any, form: RmsForm
) -> Any:
    computed = op.Cast(x, _outputs=["to_compute"]) if form.cast_in else x
    mean = op.ReduceMean(op.Pow(computed, exponent), _allow_other_inputs=True, _outputs=["mean"])
    rms = op.Sqrt(op.Add(mean, epsilon))
    inverse = op.Div(one, rms) if form.div else op.Reciprocal(rms)
    normed = op.Mul(computed, inverse) if form.x_first else op.Mul(inverse, computed)
    if form.cast_out:
        normed = op.Cast(normed)
    return op.Mul(scale, normed) if form.scale_first else op.Mul(normed, scale)


def _reduced_axes(mean: ir.Value) -> list[int] | None:
    node = mean.producer()
    if node is None:
        return None
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return ints(node.inputs[1])
    attribute = node.attributes.get("axes")
    return list(attribute.as_ints()) if attribute is not None else None


def rms_check(
    x: ir.Value, mean: ir.Value, exponent: ir.Value, epsilon: ir.Value, one: ir.Value | None,
    to_compute: ir.Value | None,
) -> tuple[pattern.MatchResult, float, int]:  # fmt: skip
    """Whether the matched subgraph is an RMSNorm over the last axis; its epsilon and stash type."""
    result = pattern.MatchResult()
    if scalar(exponent) != 2.0:
        return result.fail("Pow's exponent is not the constant 2", exponent), 0.0, 0
    eps = scalar(epsilon)
    if eps is None or eps < 0:
        return result.fail("epsilon is not a non-negative scalar constant", epsilon), 0.0, 0
    if one is not None and scalar(one) != 1.0:
        return result.fail("Div's numerator is not the constant 1", one), 0.0, 0
    node = mean.producer()
    if node is not None and node.attributes.get_int("keepdims", 1) != 1:
        return result.fail("ReduceMean drops the reduced axis (keepdims=0)", mean), 0.0, 0
    axes = _reduced_axes(mean)
    last = rank(x)
    if axes is None or not (axes == [-1] or (last is not None and axes == [last - 1])):
        return result.fail(f"ReduceMean reduces axes {axes}, not the last axis only", mean), 0.0, 0
    stash = x.dtype
    if to_compute is not None and to_compute.producer() is not None:
        stash = ir.DataType(to_compute.producer().attributes.get_int("to", 0))  # type: ignore[union-attr]
    if stash not in _FLOAT_STASH:
        return result.fail(f"the normalisation runs in {stash}, not float or double", x), 0.0, 0
    return result, eps, int(stash)


class RmsNormalizationRule(pattern.RewriteRuleClassBase):
    """RMSNorm -> ONNX ``RMSNormalization`` (opset 23; the fusion declares 24)."""

    def __init__(self, form: RmsForm) -> None:
        super().__init__(f"RMSNormalization{form.name}")
        self._form = form

    def pattern(self, op, x, scale, exponent, epsilon, one):  # type: ignore[no-untyped-def]
        return _rms_pattern(op, x, scale, exponent, epsilon, one, self._form)

    def check(self, op, x, mean, exponent, epsilon, one=None, to_compute=None, **_):  # type: ignore[no-untyped-def]
        result, self._epsilon, self._stash = rms_check(x, mean, exponent, epsilon, one, to_compute)
        return result

    def rewrite(self, op, x, scale, **_):  # type: ignore[no-untyped-def]
        return op.RMSNormalization(x, scale, axis=-1, epsilon=self._epsilon, stash_type=self._stash)


#: The input types ONNX Runtime's CPU ``SimplifiedLayerNormalization`` kernel takes.
_SIMPLIFIED_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16})


class SimplifiedRmsNormalizationRule(pattern.RewriteRuleClassBase):
    """RMSNorm -> ONNX Runtime's ``SimplifiedLayerNormalization`` (default domain)."""

    def __init__(self, form: RmsForm) -> None:
        super().__init__(f"SimplifiedLayerNormalization{form.name}")
        self._form = form

    def pattern(self, op, x, scale, exponent, epsilon, one):  # type: ignore[no-untyped-def]
        return _rms_pattern(op, x, scale, exponent, epsilon, one, self._form)

    def check(self, op, x, scale, mean, exponent, epsilon, one=None, to_compute=None, **_):  # type: ignore[no-untyped-def]
        result, self._epsilon, self._stash = rms_check(x, mean, exponent, epsilon, one, to_compute)
        if not result:
            return result
        for value in (x, scale):
            if value.dtype not in _SIMPLIFIED_TYPES:
                return result.fail(f"ONNX Runtime's CPU kernel takes no {value.dtype}", value)
        return result

    def rewrite(self, op, x, scale, **_):  # type: ignore[no-untyped-def]
        return op.SimplifiedLayerNormalization(
            x, scale, axis=-1, epsilon=self._epsilon, stash_type=self._stash
        )


class SkipRmsNormalizationRule(pattern.RewriteRuleClassBase):
    """``s = a + b`` then RMSNorm of ``s`` -> ``SkipSimplifiedLayerNormalization(a, b, scale)``,
    whose fourth output is ``s`` (the residual the layer goes on with)."""

    def __init__(self, form: RmsForm) -> None:
        super().__init__(f"SkipSimplifiedLayerNormalization{form.name}")
        self._form = form

    def pattern(self, op, a, b, scale, exponent, epsilon, one):  # type: ignore[no-untyped-def]
        summed = op.Add(a, b, _outputs=["summed"])
        return _rms_pattern(op, summed, scale, exponent, epsilon, one, self._form), summed

    def check(
        self, op, a, b, scale, summed, mean, exponent, epsilon, one=None, to_compute=None, **_
    ):  # type: ignore[no-untyped-def]
        result, self._epsilon, _ = rms_check(summed, mean, exponent, epsilon, one, to_compute)
        if not result:
            return result
        return skip_check(a, b, scale)

    def rewrite(self, op, a, b, scale, **_):  # type: ignore[no-untyped-def]
        outputs = op.SkipSimplifiedLayerNormalization(
            a, b, scale, epsilon=self._epsilon, _domain=MS_DOMAIN, _outputs=4
        )
        return outputs[0], outputs[3]


def skip_check(a: ir.Value, b: ir.Value, scale: ir.Value) -> pattern.MatchResult:
    """The skip kernels take two 3-D (or 2-D) tensors of one shape and a 1-D scale, one type."""
    result = pattern.MatchResult()
    ranks = (rank(a), rank(b))
    if None in ranks:
        return result.fail("the rank of an Add input is unknown", a if ranks[0] is None else b)
    if ranks[0] != ranks[1] or ranks[0] not in (2, 3):
        return result.fail(f"the Add inputs have ranks {ranks}, not both 3 (or 2)", a)
    if rank(scale) not in (None, 1):
        return result.fail("the scale is not 1-D", scale)
    types = {v.dtype for v in (a, b, scale) if v.dtype is not None}
    if len(types) > 1:
        return result.fail(f"the inputs and the scale have different types {sorted(types)}", a)
    return result


class SkipLayerNormalizationRule(pattern.RewriteRuleClassBase):
    """``s = a + b`` then ``LayerNormalization(s)`` over the last axis ->
    ``SkipLayerNormalization(a, b, scale[, bias])``, fourth output ``s``."""

    def __init__(self, with_bias: bool) -> None:
        super().__init__(f"SkipLayerNormalization{'Bias' if with_bias else ''}")
        self._with_bias = with_bias

    def pattern(self, op, a, b, scale, bias):  # type: ignore[no-untyped-def]
        summed = op.Add(a, b, _outputs=["summed"])
        if self._with_bias:
            normed = op.LayerNormalization(summed, scale, bias, _outputs=["normed"])
        else:
            normed = op.LayerNormalization(summed, scale, _outputs=["normed"])
        return normed, summed

    def check(self, op, a, b, scale, normed, bias=None, **_):  # type: ignore[no-untyped-def]
        node = normed.producer()
        axis = node.attributes.get_int("axis", -1)
        last = rank(a)
        if axis != -1 and (last is None or axis != last - 1):
            return pattern.MatchResult().fail(f"LayerNormalization over axis {axis}", normed)
        if len(node.outputs) > 1 and any(o.uses() for o in node.outputs[1:]):
            return pattern.MatchResult().fail("LayerNormalization's mean/inv_std are used", normed)
        if node.attributes.get_int("stash_type", 1) != int(ir.DataType.FLOAT):
            return pattern.MatchResult().fail("LayerNormalization computes not in float", normed)
        self._epsilon = node.attributes.get_float("epsilon", 1e-5)
        return skip_check(a, b, scale)

    def rewrite(self, op, a, b, scale, bias=None, **_):  # type: ignore[no-untyped-def]
        inputs = [a, b, scale, bias] if self._with_bias else [a, b, scale]
        outputs = op.SkipLayerNormalization(
            *inputs, epsilon=self._epsilon, _domain=MS_DOMAIN, _outputs=4
        )
        return outputs[0], outputs[3]


def standard_rules() -> list[pattern.RewriteRule]:
    """RMSNorm as ONNX ``RMSNormalization``."""
    return [RmsNormalizationRule.rule(form) for form in RMS_FORMS]


def onnxruntime_rules() -> list[pattern.RewriteRule]:
    """Residual + RMSNorm or LayerNorm as ONNX Runtime's skip kernels."""
    return [
        *(SkipRmsNormalizationRule.rule(form) for form in RMS_FORMS),
        *(SkipLayerNormalizationRule.rule(bias) for bias in (True, False)),
    ]


def simplified_rules() -> list[pattern.RewriteRule]:
    """A standalone RMSNorm as ``SimplifiedLayerNormalization`` (``load_time_fusions.py``, after
    every other pass: onnx's shape inference knows no such op, and the passes before read shapes
    through the norms, Qwen3's per-head ones before its attention fuses)."""
    return [SimplifiedRmsNormalizationRule.rule(form) for form in RMS_FORMS]
