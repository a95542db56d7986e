"""bench/stream_trace_proto.py: the streamed capture of a tiny checkpoint equals the eager one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_streamed_capture_is_bitwise_the_eager_one(tmp_path: Path, dynamo: bool) -> None:
    ckpt = tmp_path / "ckpt"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_checkpoint.py"), str(ckpt), "--shape", "tiny"],
        check=True,
        capture_output=True,
    )
    command = [sys.executable, str(REPO / "bench" / "stream_trace_proto.py"), str(ckpt)]
    command += [str(tmp_path / "out"), "--all", "--seq", "8"] + (["--dynamo"] if dynamo else [])
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    stream = next(x for x in lines if x.get("mode") == "stream")
    assert stream["layer_calls"] == 2 and stream["meta_parameters_after"] == 18
    assert lines[-1]["same_record"] and lines[-1]["arrays_bitwise_equal"] >= 10
