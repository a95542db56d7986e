"""first_divergent and nested_calls: the blame goes to the innermost diverging call."""

from __future__ import annotations

from check_toys import make_toy

from hyperexport.library.check import FunctionResult
from hyperexport.library.check.call_plan import first_divergent, nested_calls, select_calls


def result(call_id: str, ok: bool) -> FunctionResult:
    return FunctionResult(call_id, call_id.split("#")[0], "c", "d", "f", ok, ())


def blame(oks: dict[int, bool], nested: list[list[int]]) -> int | None:
    results = {i: result(f"m{i}#0", ok) for i, ok in oks.items()}
    return first_divergent(range(len(nested)), results.get, nested)


def test_innermost_diverging_descendant_is_blamed() -> None:
    # 0 encloses 1 and 2; 2 encloses 3.
    nested = [[1, 2, 3], [], [3], []]
    assert blame({0: False, 1: True, 2: False, 3: True}, nested) == 2
    assert blame({0: False, 1: True, 2: False, 3: False}, nested) == 3
    assert blame({0: False, 1: False, 2: False, 3: False}, nested) == 1
    assert blame({0: False, 1: True, 2: True, 3: True}, nested) == 0
    assert blame({0: True, 1: True, 2: True, 3: True}, nested) is None


def test_unchecked_calls_are_not_blamed() -> None:
    nested = [[1], [], []]
    assert blame({0: False, 2: False}, nested) == 0
    assert blame({2: False}, nested) == 2


def test_nested_calls_and_scope_selection_from_toy() -> None:
    toy = make_toy("per_type")
    assert nested_calls(toy.manifest, toy.capture) == [[1], [], [], []]
    assert select_calls(toy.manifest, "all") == [0, 1, 2, 3]
    assert select_calls(toy.manifest, "first_instance") == [0, 1]
    assert select_calls(toy.manifest, "none") == []
