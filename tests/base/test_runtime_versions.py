"""The IR version a model is written at, and what each ONNX Runtime release loads
(``versions.lowest_ir_version``, ``versions.ONNXRUNTIME_LOADS``)."""

from __future__ import annotations

import itertools

import onnx
import onnx.helper
import pytest

from hyperexport.base import versions


def _highest_opset() -> int:
    return max(int(row[2]) for row in onnx.helper.VERSION_TABLE)


@pytest.mark.parametrize("opset", sorted({int(row[2]) for row in onnx.helper.VERSION_TABLE}))
def test_the_lowest_ir_version_is_onnxs_own_for_each_opset(opset: int) -> None:
    """Cross-checked with onnx's own ``find_min_ir_version_for`` (another reading of the same
    table), for every default-domain opset an onnx release shipped (opsets 2 to 4 were never
    one's highest: onnx's helper knows no IR for them; ours gives the next release's)."""
    ids = [onnx.helper.make_opsetid("", opset)]
    assert versions.lowest_ir_version({"": opset}, functions=False) == (
        onnx.helper.find_min_ir_version_for(ids)
    )


def test_functions_need_ir_8_and_other_domains_ask_nothing() -> None:
    assert versions.lowest_ir_version({"": 7}, functions=False) == 3
    assert versions.lowest_ir_version({"": 7}, functions=True) == 8
    foreign = {"": 17, "com.microsoft": 1, "hyperexport.fn": 1, "my.ops": 40}
    assert versions.lowest_ir_version(foreign, functions=True) == 8
    # ai.onnx.ml is ONNX's: ml opset 5 came with onnx 1.18 (IR 11)
    assert versions.lowest_ir_version({"": 17, "ai.onnx.ml": 5}, functions=True) > 8


def test_an_opset_beyond_the_installed_onnx_is_refused() -> None:
    with pytest.raises(ValueError, match=f"no IR version for opset ai.onnx {_highest_opset() + 1}"):
        versions.lowest_ir_version({"": _highest_opset() + 1}, functions=False)


def test_the_runtime_table_starts_at_1_16_and_each_release_loads_what_its_opset_needs() -> None:
    rows = versions.ONNXRUNTIME_LOADS
    assert rows[0].release == "1.16"
    releases = [tuple(int(p) for p in row.release.split(".")) for row in rows]
    assert releases == sorted(releases) and len(set(releases)) == len(releases)
    for earlier, later in itertools.pairwise(rows):
        assert later.max_opset >= earlier.max_opset
        assert later.max_ir_version >= earlier.max_ir_version
    for row in rows:  # a release's highest opset, with functions, fits its highest IR version
        assert versions.lowest_ir_version({"": row.max_opset}, functions=True) <= (
            row.max_ir_version
        )


@pytest.mark.parametrize(
    ("release", "opset", "ir_version", "refused"),
    [
        ("1.16", 17, 8, None),
        ("1.16.3", 19, 9, None),
        ("1.16", 20, 9, "onnxruntime 1.16 loads opsets up to 19 at IR versions up to 9"),
        ("1.16.3", 18, 10, "onnxruntime 1.16.3 loads opsets up to 19 at IR versions up to 9"),
        ("1.17.1", 20, 9, None),
        ("1.20", 24, 12, "onnxruntime 1.20 loads opsets up to 21 at IR versions up to 10"),
        ("1.15.1", 17, 8, "onnxruntime 1.15.1 is older than the releases hyperexport targets"),
        ("1.32.0", 24, 12, None),  # newer than the table: not checked here
    ],
)
def test_what_a_runtime_release_cannot_load_is_refused_in_one_line(
    release: str, opset: int, ir_version: int, refused: str | None
) -> None:
    found = versions.onnxruntime_refusal(release, opset, ir_version)
    if refused is None:
        assert found is None
    else:
        assert found is not None and found.startswith(refused) and "\n" not in found
        if "loads" in refused:
            assert f"writes opset {opset} at IR {ir_version}" in found


def test_a_release_past_the_table_is_said_to_be_unchecked() -> None:
    last = versions.ONNXRUNTIME_LOADS[-1].release
    assert not versions.onnxruntime_beyond_table(last)
    assert not versions.onnxruntime_beyond_table(f"{last}.9")
    major, minor = last.split(".")
    assert versions.onnxruntime_beyond_table(f"{major}.{int(minor) + 1}")


def test_older_than_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "installed_version", lambda name: "1.18.1")
    assert versions.onnxruntime_older_than_installed("1.17.3")
    assert not versions.onnxruntime_older_than_installed("1.18.0")
    monkeypatch.setattr(versions, "installed_version", lambda name: None)
    assert not versions.onnxruntime_older_than_installed("1.16")
