from __future__ import annotations

import pytest

from hyperexport.base.sizes import human_size
from hyperexport.product.cli.quantities import human_age, parse_age, parse_size
from hyperexport.product.cli.table import render_table


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("100", 100),
        ("500M", 500 << 20),
        ("500MB", 500 << 20),
        ("500mib", 500 << 20),
        ("2G", 2 << 30),
        ("1.5G", 3 << 29),
        ("4k", 4096),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-1M", "5Q", "1.2.3G", "7d"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * 86400),
        ("12h", 43200),
        ("30m", 1800),
        ("1d12h", 129600),
        ("0", 0),
        ("2w", 1209600),
    ],
)
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "1h-2m", "500M"])
def test_parse_age_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not an age"):
        parse_age(text)


def test_human_size_and_age() -> None:
    assert human_size(0) == "0 B"
    assert human_size(1023) == "1023 B"
    assert human_size(1536) == "1.5 KiB"
    assert human_size(parse_size("2G")) == "2.0 GiB"
    assert human_age(59) == "59s"
    assert human_age(90) == "1m"
    assert human_age(7200) == "2h"
    assert human_age(3 * 86400 + 5) == "3d"


def test_render_table_aligns_columns() -> None:
    lines = render_table(["KEY", "SIZE", "NOTE"], [["ab12", "1.0 KiB", ""], ["c", "12 B", "x"]])
    assert lines == ["KEY   SIZE     NOTE", "ab12  1.0 KiB", "c     12 B     x"]
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        render_table(["A", "B", "C"], [["1", "2"]])
