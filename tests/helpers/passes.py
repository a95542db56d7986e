"""What the pass tests share: parse ONNX text, run a model checked in ORT, and apply a pass
asserting unchanged outputs and a no-op second run."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from tests.helpers.ort import session_for


def parse(text: str) -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(text))


def run_checked(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Full-check the model, then run it in ORT on the feeds it takes."""
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    session = session_for(proto)
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def apply_preserving(
    make_pass: Callable[[], ir.passes.PassBase], text: str, feeds: Mapping[str, np.ndarray]
) -> tuple[ir.Model, bool]:
    """Run the pass on ``text``; assert ORT outputs are unchanged and a second run is a no-op."""
    model = parse(text)
    before = run_checked(model, feeds)
    modified = make_pass()(model).modified
    after = run_checked(model, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not make_pass()(model).modified
    return model, modified
