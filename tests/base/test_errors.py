"""How hyperexport relays torch's errors: no ANSI codes, known failures as one line with the fix."""

from __future__ import annotations

from hyperexport.base.errors import (
    ModelForwardError,
    ModuleExportError,
    StageError,
    relayed,
    strip_ansi,
)

_COLOURED = (
    "Failed to convert the exported program to an ONNX model. \x1b[96mThis is step 3/3\x1b[0m "
    "of exporting the model to ONNX.\n- Create an issue against the \x1b[96m*onnx*\x1b[0m "
    "component.\n\x1b[1;31mError\x1b[0m"
)


def test_strip_ansi_removes_colours_and_keeps_the_text() -> None:
    assert strip_ansi(_COLOURED) == (
        "Failed to convert the exported program to an ONNX model. This is step 3/3 of "
        "exporting the model to ONNX.\n- Create an issue against the *onnx* component.\nError"
    )


def test_every_error_that_relays_a_cause_strips_its_colours() -> None:
    cause = RuntimeError(_COLOURED)
    for error in (
        ModuleExportError("layers.0", True, cause),
        ModelForwardError("layers.0", cause),
        StageError("export", cause),
        StageError("export", ModuleExportError("layers.0", True, cause)),
    ):
        assert "\x1b" not in str(error) and "This is step 3/3" in str(error), type(error)


def test_an_unknown_failure_keeps_its_type_and_text() -> None:
    assert relayed(ValueError("bad\nthing")) == "ValueError: bad\nthing"
    assert relayed(ValueError("bad"), with_type=False) == "bad"


def test_histc_becomes_one_line_naming_the_op_and_the_fix() -> None:
    text = "Exporting the operator 'aten::histc' to ONNX opset version 18 is not supported\n..."
    message = str(ModuleExportError("layers.0", False, RuntimeError(text)))
    assert "\n" not in message
    assert "module 'layers.0'" in message and "aten::histc" in message
    assert "hyperexport/library/transformers/moe.py" in message


def test_grouped_mm_becomes_one_line_naming_the_op_and_the_fix() -> None:
    text = _COLOURED + (
        "\n## Exception summary\nNo ONNX function found for <OpOverload(op='transformers."
        "grouped_mm_fallback', overload='default')>"
    )
    message = str(ModuleExportError("layers.1", True, RuntimeError(text)))
    assert "\n" not in message and "\x1b" not in message
    assert "transformers::grouped_mm_fallback" in message and "MOE_FAMILIES" in message
