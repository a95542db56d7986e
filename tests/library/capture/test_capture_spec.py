"""The frozen capture specification (contracts/capture_spec.py): JSON round trip, corruption,
and the same capture from the library entry and from the record."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.base.contracts.capture_spec import CaptureSpec, InputEntry
from hyperexport.base.contracts.names import CAPTURE_SPEC_JSON
from hyperexport.base.errors import CorruptRecordError

SPEC = CaptureSpec(
    hiera=("transformers.models.llama.modeling_llama.LlamaDecoderLayer",),
    method="forward",
    dynamo=True,
    attention="hyperexport",
    inputs=(
        InputEntry("input_ids", (2, 16), "int64", 0, 128, 0, ((0, "batch"), (1, "seq")), (3, 9)),
        InputEntry("past.0.key", (2, 4, 3, 8), "float32", -1.0, 1.0, 1),
    ),
    dynamic_axes=(("input_ids", ((0, "batch"), (1, "seq"))),),
    probe_shapes=(("input_ids", (3, 9)),),
)


def test_the_record_round_trips_through_json(tmp_path: Path) -> None:
    SPEC.save(tmp_path)
    assert CaptureSpec.load(tmp_path) == SPEC
    assert (tmp_path / CAPTURE_SPEC_JSON).read_text() == SPEC.dumps()  # canonical
    assert SPEC.capture_settings() == {
        "method": "forward",
        "attention": "hyperexport",
        "dynamic_axes": {"input_ids": {0: "batch", 1: "seq"}},
        "probe_shapes": {"input_ids": (3, 9)},
    }
    assert SPEC.generators()["input_ids"] == {
        "shape": [2, 16],
        "dtype": "int64",
        "low": 0,
        "high": 128,
        "seed": 0,
    }
    static = CaptureSpec(hiera=(), method="forward", dynamo=False)
    assert static.capture_settings()["dynamic_axes"] is None


@pytest.mark.parametrize(
    "text", ["[]", '{"format": 0}', SPEC.dumps().replace('"hiera"', '"classes"'), "{"]
)
def test_a_corrupt_record_is_refused(text: str) -> None:
    with pytest.raises(CorruptRecordError, match=CAPTURE_SPEC_JSON):
        CaptureSpec.loads(text)


def test_the_inputs_made_from_the_record_are_the_recipes() -> None:
    torch = pytest.importorskip("torch")
    from hyperexport.library.models.inputs import make_inputs
    from hyperexport.product.from_recipe.resolved_capture import example_inputs

    made = example_inputs(CaptureSpec.loads(SPEC.dumps()))
    direct = make_inputs(
        {
            "input_ids": {"shape": [2, 16], "dtype": "int64", "low": 0, "high": 128, "seed": 0},
            "past.0.key": {
                "shape": [2, 4, 3, 8],
                "dtype": "float32",
                "low": -1,
                "high": 1,
                "seed": 1,
            },
        }
    )
    assert torch.equal(made["input_ids"], direct["input_ids"])
    assert torch.equal(made["past"]["0"]["key"], direct["past"]["0"]["key"])
