"""The Task protocol: every task declared once, its parts where the stages that call them are,
and each stage's key covering only its own part."""

from __future__ import annotations

from hyperexport.engine.code_closure import package_sources, stage_code
from hyperexport.library.tasks.decode import DECODES
from hyperexport.library.tasks.judge import JUDGES
from hyperexport.library.tasks.models import MODELS
from hyperexport.library.tasks.registry import TASKS
from hyperexport.product.builds.fingerprint import KEYED_PACKAGE
from hyperexport.product.config.schema import IMPLEMENTED_TASKS


def test_every_task_has_its_parts_and_the_schema_offers_exactly_them() -> None:
    assert set(MODELS) == set(TASKS) == set(IMPLEMENTED_TASKS)
    decoding = {name for name, task in TASKS.items() if task.evaluate_files}
    assert set(DECODES) == decoding == {n for n, t in TASKS.items() if t.check_files}
    assert set(JUDGES) == decoding
    assert "forward" not in decoding


def test_the_folders_and_files_of_one_graph_and_of_two() -> None:
    one, two = TASKS["forward"], TASKS["text2text-generation"]
    assert one.folders() == ("",) and one.per_graph({"capture": "capture.json"}) == {
        "capture": "capture.json"
    }
    assert two.per_graph({"capture": "capture.json"}) == {
        "encoder_capture": "encoder/capture.json",
        "decoder_capture": "decoder/capture.json",
    }
    assert [two.model_file(g) for g in two.graphs] == ["encoder_model.onnx", "decoder_model.onnx"]
    assert one.model_file("") == "model.onnx" and two.manifest_file("decoder") == (
        "decoder_manifest.json"
    )


def _code(stage_module: str) -> set[str]:
    return set(stage_code(stage_module, (), package_sources(KEYED_PACKAGE)))


def test_each_stage_s_key_covers_its_own_part_of_the_tasks_only() -> None:
    """A change in a task's judge reruns the check, not the trace; a change in its step model
    reruns trace and export, not the check."""
    trace, evaluate, check = (
        _code(f"hyperexport.product.stages.{name}") for name in ("trace", "evaluate", "check")
    )
    models, decode, judge = (
        f"hyperexport/library/tasks/{name}.py" for name in ("models", "decode", "judge")
    )
    steps, registry = "hyperexport/library/tasks/steps.py", "hyperexport/library/tasks/registry.py"
    assert {models, steps, registry} <= trace and not {decode, judge} & trace
    assert {decode, registry} <= evaluate and not {models, steps, judge} & evaluate
    assert {judge, registry} <= check and not {models, steps, decode} & check
