"""hyperexport.library.progress: plain lines off a terminal (none for a short step), a live bar on one."""

from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hyperexport.library import progress

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPEREXPORT_PROGRESS", "lines")


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hyperexport.library.progress"]


def test_a_short_step_logs_nothing(lines: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert list(progress.track([1, 2, 3], "exporting units", unit="units")) == [1, 2, 3]
    assert _messages(caplog) == []


def test_a_long_step_logs_periodic_lines_and_its_end(
    lines: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    assert list(progress.track(iter("abc"), "checking functions", unit="functions", total=3))
    messages = _messages(caplog)
    assert messages[0].startswith("checking functions: 1 functions of 3 functions (33%)")
    assert messages[-1].startswith("checking functions: 3 functions of 3 functions (100%), done")


def test_a_step_over_layers_shows_the_anonymous_memory_it_holds(
    lines: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    held = []
    for _ in progress.track(range(2), "exporting units", unit="units", memory=True):
        held.append(bytearray(64 << 20))  # 64 MB more anonymous memory each step
    first, second = (_anonymous_mb(m) for m in _messages(caplog)[:2])
    assert second - first >= 60  # the second line saw the second step's 64 MB


def _anonymous_mb(message: str) -> float:
    """The memory a progress line shows (``..., 1.2 GiB anonymous (0s)``), in MiB."""
    amount, unit = message.split(", ")[1].split()[:2]
    assert message.split(", ")[1].split()[2] == "anonymous", message
    return float(amount) * {"MiB": 1, "GiB": 1024}[unit]


def test_a_count_advanced_from_hooks_is_reported(
    lines: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    with progress.counting("running hiera instances", unit="instances", total=4) as update:
        update(1)
        update(4)
    messages = _messages(caplog)
    assert messages[0] == "running hiera instances: 1 instances of 4 instances (25%) (0s)"
    assert messages[-1].startswith("running hiera instances: 4 instances of 4 instances (100%)")
    assert "anonymous" not in messages[-1]


def test_bytes_written_are_reported(
    lines: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.01)
    (tmp_path / "old.bin").write_bytes(b"x" * 100)  # already there: not counted
    with progress.watch_bytes(tmp_path, "writing model.onnx"):
        (tmp_path / "model.onnx").write_bytes(b"x" * (3 << 20))
        time.sleep(0.05)
    assert any("writing model.onnx: 3.0 MiB" in m for m in _messages(caplog))


def test_a_symlink_is_not_counted_as_bytes_written(
    lines: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The rewrite stage links an unchanged data file: it wrote no bytes."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    monkeypatch.setattr(progress, "POLL", 0.01)
    big = tmp_path / "weights.data"
    big.write_bytes(b"x" * (5 << 20))
    out = tmp_path / "out"
    out.mkdir()
    with progress.watch_bytes(out, "writing model.onnx"):
        (out / "model.onnx.data").symlink_to(big)
        (out / "model.onnx").write_bytes(b"x" * (1 << 20))
        time.sleep(0.05)
    messages = _messages(caplog)
    assert any("writing model.onnx: 1.0 MiB" in m for m in messages), messages
    assert not any("6.0 MiB" in m for m in messages)


def test_off_is_silent(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HYPEREXPORT_PROGRESS", "off")
    monkeypatch.setattr(progress, "PERIOD", 0.0)
    caplog.set_level(logging.INFO)
    assert list(progress.track(range(3), "x")) == [0, 1, 2]
    assert _messages(caplog) == []


SCRIPT = """
import time
from hyperexport.library import progress
for _ in progress.track(range(3), "exporting units", unit="units"):
    for _ in progress.track(range(2), "checking functions", unit="functions"):
        time.sleep(0.3)
print("finished")
"""


def test_a_terminal_gets_a_live_bar_nested_bars_share_it() -> None:
    """Run in a pseudo-terminal: the bar is drawn (rich's bar glyphs) and nesting works."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "100"}
    env.pop("HYPEREXPORT_PROGRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT], stdin=secondary, stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0
    os.close(primary)
    text = out.decode("utf-8", "replace")
    assert "finished" in text
    assert "exporting units" in text and "checking functions" in text
    assert "━" in text  # rich's bar
