"""Fusion rules for GELU activations as ONNX Runtime's kernels (``com.microsoft``).

* ``FastGelu``: the tanh approximation ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``
  (GPT-2's ``gelu_new``), or ONNX ``Gelu`` with ``approximate="tanh"``;
* ``Gelu``: the exact ``x * 0.5 * (1 + erf(x / sqrt(2)))`` (BERT's ``gelu``), or ONNX ``Gelu``;
* ``QuickGelu``: ``x * sigmoid(alpha * x)`` (CLIP's ``quick_gelu``, alpha 1.702); and SiLU
  ``x * sigmoid(x)`` as alpha 1, last (``load_time_fusions.py``).

The exporters associate the products differently (``(0.5 * x) * t``, ``x * (0.5 * t)``,
``(x * t) * 0.5``): each association is a rule, in both orders of its product of two computed
values; constants are second (``fuse_ops`` puts them there before the rules run). Constants
must match to 1e-4 relative.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from hyperexport.library.passes.fuse_values import scalar

MS_DOMAIN = "com.microsoft"
#: The values of ONNX Gelu's ``approximate`` attribute (ONNX's vocabulary).
GELU_APPROXIMATIONS = ("none", "tanh")


def _near(value: ir.Value | None, expected: float) -> bool:
    got = scalar(value)
    return got is not None and math.isclose(got, expected, rel_tol=1e-4)


def _outer(op, x, half, inner, association: str, swap: bool):  # type: ignore[no-untyped-def]
    """``0.5 * x * inner`` in one of the exporters' associations, its constant second, its
    product of two computed values in either order (``swap``)."""
    if association == "half_x":
        pair = (op.Mul(x, half), inner)
        return op.Mul(*reversed(pair)) if swap else op.Mul(*pair)
    if association == "half_inner":
        pair = (x, op.Mul(inner, half))
        return op.Mul(*reversed(pair)) if swap else op.Mul(*pair)
    pair = (x, inner)
    return op.Mul(op.Mul(*reversed(pair)) if swap else op.Mul(*pair), half)


class FastGeluRule(pattern.RewriteRuleClassBase):
    """The tanh approximation of GELU -> ``FastGelu``."""

    def __init__(self, association: str, swap: bool, x_first: bool) -> None:
        super().__init__(f"FastGelu_{association}_{int(swap)}{int(x_first)}")
        self._association = association
        self._swap = swap
        self._x_first = x_first

    def pattern(self, op, x, half, one, three, k, c):  # type: ignore[no-untyped-def]
        cube = op.Mul(op.Pow(x, three), k)
        cubic = op.Add(x, cube) if self._x_first else op.Add(cube, x)
        inner = op.Add(op.Tanh(op.Mul(cubic, c)), one)
        return _outer(op, x, half, inner, self._association, self._swap)

    def check(self, op, half, one, three, k, c, **_):  # type: ignore[no-untyped-def]
        expected = (
            (half, 0.5),
            (one, 1.0),
            (three, 3.0),
            (k, 0.044715),
            (c, math.sqrt(2 / math.pi)),
        )
        for value, number in expected:
            if not _near(value, number):
                return pattern.MatchResult().fail(f"a constant is not {number}", value)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        return op.FastGelu(x, _domain=MS_DOMAIN)


class ErfGeluRule(pattern.RewriteRuleClassBase):
    """The exact (erf) GELU -> ``com.microsoft.Gelu``."""

    def __init__(self, association: str, swap: bool, divide: bool) -> None:
        super().__init__(f"Gelu_{association}_{int(swap)}{'div' if divide else 'mul'}")
        self._association = association
        self._swap = swap
        self._divide = divide

    def pattern(self, op, x, half, one, root):  # type: ignore[no-untyped-def]
        scaled = op.Div(x, root) if self._divide else op.Mul(x, root)
        inner = op.Add(op.Erf(scaled), one)
        return _outer(op, x, half, inner, self._association, self._swap)

    def check(self, op, half, one, root, **_):  # type: ignore[no-untyped-def]
        factor = math.sqrt(2) if self._divide else 1 / math.sqrt(2)
        for value, number in ((half, 0.5), (one, 1.0), (root, factor)):
            if not _near(value, number):
                return pattern.MatchResult().fail(f"a constant is not {number}", value)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        return op.Gelu(x, _domain=MS_DOMAIN)


class OnnxGeluRule(pattern.RewriteRuleClassBase):
    """ONNX ``Gelu`` (opset 20) -> ``FastGelu`` (tanh) or ``com.microsoft.Gelu``."""

    def pattern(self, op, x):  # type: ignore[no-untyped-def]
        return op.Gelu(x, _outputs=["y"])

    def check(self, op, y, **_):  # type: ignore[no-untyped-def]
        self._approximate = y.producer().attributes.get_string("approximate", "none")
        if self._approximate not in GELU_APPROXIMATIONS:
            return pattern.MatchResult().fail(f"approximate={self._approximate!r}", y)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        if self._approximate == "tanh":
            return op.FastGelu(x, _domain=MS_DOMAIN)
        return op.Gelu(x, _domain=MS_DOMAIN)


class QuickGeluRule(pattern.RewriteRuleClassBase):
    """``x * sigmoid(alpha * x)`` with a constant ``alpha`` -> ``QuickGelu``."""

    def __init__(self, swap: bool) -> None:
        super().__init__(f"QuickGelu_{int(swap)}")
        self._swap = swap

    def pattern(self, op, x, alpha):  # type: ignore[no-untyped-def]
        gate = op.Sigmoid(op.Mul(x, alpha))
        return op.Mul(gate, x) if self._swap else op.Mul(x, gate)

    def check(self, op, alpha, **_):  # type: ignore[no-untyped-def]
        self._alpha = scalar(alpha)
        if self._alpha is None:
            return pattern.MatchResult().fail("alpha is not a scalar constant", alpha)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        return op.QuickGelu(x, alpha=self._alpha, _domain=MS_DOMAIN)


class SiluRule(pattern.RewriteRuleClassBase):
    """``x * sigmoid(x)`` (SiLU, Llama's MLP gate) -> ``QuickGelu`` with alpha 1, as the builder
    writes it; float only (ONNX Runtime's CPU kernel)."""

    def __init__(self, swap: bool) -> None:
        super().__init__(f"Silu_{int(swap)}")
        self._swap = swap

    def pattern(self, op, x):  # type: ignore[no-untyped-def]
        gate = op.Sigmoid(x)
        return op.Mul(gate, x) if self._swap else op.Mul(x, gate)

    def check(self, op, x, **_):  # type: ignore[no-untyped-def]
        if x.dtype != ir.DataType.FLOAT:
            return pattern.MatchResult().fail(f"ONNX Runtime's CPU QuickGelu takes no {x.dtype}", x)
        return pattern.MatchResult()

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        return op.QuickGelu(x, alpha=1.0, _domain=MS_DOMAIN)


_ASSOCIATIONS = ("half_x", "half_inner", "inner_half")
_BOTH = (False, True)


def rules() -> list[pattern.RewriteRule]:
    """Every form of each GELU, constants second (the fusion puts them there first)."""
    return [
        *(FastGeluRule.rule(a, s, x) for a in _ASSOCIATIONS for s in _BOTH for x in _BOTH),
        *(ErfGeluRule.rule(a, s, d) for a in _ASSOCIATIONS for s in _BOTH for d in _BOTH),
        OnnxGeluRule.rule(),
        *(QuickGeluRule.rule(s) for s in _BOTH),
    ]


def silu_rules() -> list[pattern.RewriteRule]:
    """SiLU as ``QuickGelu`` (``load_time_fusions.py``)."""
    return [SiluRule.rule(s) for s in _BOTH]
