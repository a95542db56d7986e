"""What the check vouches for: the published files the evaluation ran, by the digests its key
covers, and a refusal when the evaluation ran other files."""

from __future__ import annotations

from pathlib import Path

from hyperexport.library.tasks.registry import FORWARD_TASK, TEXT_GENERATION_TASK
from hyperexport.product.stages.judged_files import check_evaluated, judged_files, write_evaluated

DIGESTS = {
    "trace": {"capture.json": "a" * 64, "genai_config.json": "b" * 64},
    "export": {"bundle.json": "c" * 64},
    "rewrite": {"model.onnx": "d" * 64, "manifest.json": "e" * 64},
    "quantize": {},
}


def test_the_published_models_and_for_generation_the_genai_config() -> None:
    assert judged_files(DIGESTS, FORWARD_TASK) == {
        "manifest.json": "e" * 64,
        "model.onnx": "d" * 64,
    }
    with_config = judged_files(DIGESTS, TEXT_GENERATION_TASK)
    assert with_config["genai_config.json"] == "b" * 64 and "capture.json" not in with_config


def test_an_evaluation_of_other_files_fails_the_check_naming_the_file(tmp_path: Path) -> None:
    judged = judged_files(DIGESTS, FORWARD_TASK)
    write_evaluated(tmp_path, judged)
    assert check_evaluated(tmp_path, judged) is None
    write_evaluated(tmp_path, {**judged, "model.onnx": "f" * 64})
    error = check_evaluated(tmp_path, judged)
    assert error is not None
    assert str(error) == (
        f"the evaluation ran model.onnx sha256 {'f' * 12}, this build publishes {'d' * 12}"
    )
    write_evaluated(tmp_path, {"model.onnx": "d" * 64})
    assert (
        str(check_evaluated(tmp_path, judged))
        == f"manifest.json (sha256 {'e' * 12}) was not evaluated"
    )
