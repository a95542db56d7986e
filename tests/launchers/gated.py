"""A toy model that waits at a gate, so two sweep jobs provably overlap on one cache.

The model's factory (called by the trace stage while it holds the trace key's lock) drops a
marker naming its process, then waits until the test opens the gate. The test opens it once the
other job has logged that it waits for that lock: the race is synchronised on these two events,
never on a time window. Single flight then shows as one marker (one process built the model)
and stage statuses of one ``ran`` and one ``hit`` each.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import STAGE_NAMES
from tests.helpers.builds import TOY_SOURCE
from tests.helpers.cli import TOY_RECIPE

# hyperexport.engine.process_locks logs this while a build waits for another build's key.
WAITING = "stage trace: another build is computing it; waiting for its result"
MARKER_PREFIX = "building."

GATED_SOURCE = (
    TOY_SOURCE
    + '''

import json
import os
import pathlib
import socket
import sys
import time


def make_gated(gate: str, seed: int = 0, patience: float = 600.0):
    """The toy model once the file ``gate`` exists; a marker names who is building it."""
    gate_path = pathlib.Path(gate)
    who = f"{socket.gethostname()}.{os.getpid()}"
    ray = sys.modules.get("ray")
    where = {
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "ray_worker": bool(ray is not None and ray.is_initialized()),
    }
    (gate_path.parent / f"building.{who}").write_text(json.dumps(where))
    deadline = time.monotonic() + patience
    while not gate_path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the test never opened {gate}")
        time.sleep(0.2)
    return make(seed=seed)
'''
)


def write_gated_toy(tmp_path: Path) -> tuple[Path, Path]:
    """The gated toy package under ``tmp_path/user``; returns its recipe and the gate's path."""
    pkg = tmp_path / "user" / "hx_gated"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(GATED_SOURCE)
    gates = tmp_path / "gates"
    gates.mkdir()
    gate = gates / "open"
    recipe = tmp_path / "user" / "gated.yaml"
    toy_model = "model:\n  _target_: hx_toy.net.make\n  seed: 0\n"
    gated_model = f"model:\n  _target_: hx_gated.net.make_gated\n  gate: {gate}\n  seed: 0\n"
    assert toy_model in TOY_RECIPE
    body = TOY_RECIPE.replace(toy_model, gated_model).replace("name: toy", "name: gated")
    recipe.write_text(body.replace("hx_toy.net", "hx_gated.net"))
    return recipe, gate


def builders(gate: Path) -> dict[str, dict[str, Any]]:
    """The processes (``host.pid``) that called the gated factory, and where they ran.

    Where: ``slurm_job_id`` (None outside SLURM) and ``ray_worker`` (in a connected Ray worker).
    """
    markers = gate.parent.glob(MARKER_PREFIX + "*")
    return {p.name.removeprefix(MARKER_PREFIX): json.loads(p.read_text()) for p in markers}


class GateKeeper(threading.Thread):
    """Opens ``gate`` once a build is inside the factory and another one waits for its lock.

    ``logs`` lists the job logs to search for :data:`WAITING`. Without both events within
    ``patience`` seconds, or once :meth:`finish` is called (the sweep ended), it opens the gate
    anyway (so the sweep ends) and says what it missed.
    """

    def __init__(
        self, gate: Path, logs: Callable[[], Iterable[Path]], patience: float = 480.0
    ) -> None:
        super().__init__(daemon=True)
        self.gate = gate
        self.logs = logs
        self.patience = patience
        self.missed: list[str] = []
        self.waiting_logs: list[Path] = []
        self._finished = threading.Event()

    def finish(self) -> None:
        """Stop waiting for the events (the sweep has ended) and join the thread."""
        self._finished.set()
        self.join()

    def run(self) -> None:
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            self.waiting_logs = [p for p in self.logs() if WAITING in _text(p)]
            if builders(self.gate) and self.waiting_logs:
                break
            if self._finished.wait(0.5):
                self.missed.append("the sweep ended first")
                break
        if not builders(self.gate):
            self.missed.append("no job reached the model's factory")
        if not self.waiting_logs:
            self.missed.append(f"no job log says {WAITING!r}")
        self.gate.write_text("open")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def sweep_json(tmp_path: Path) -> dict[str, Any]:
    """The one sweep's ``sweep.json`` under ``tmp_path/outputs``."""
    (found,) = (tmp_path / "outputs" / ".sweeps").glob("*/sweep.json")
    data: dict[str, Any] = json.loads(found.read_text())
    return data


def assert_built_once(tmp_path: Path, gate: Path, engine: str) -> None:
    """Both jobs of the gated two-job sweep passed with one artifact, one process (inside
    ``engine``: ``slurm_job_id`` or ``ray_worker``) built the model, and each stage ran in one
    job and was a hit in the other."""
    (where,) = builders(gate).values()
    assert where[engine] and not any(v for k, v in where.items() if k != engine), where
    jobs = sweep_json(tmp_path)["jobs"]
    assert [(j["exit_code"], j["check"]) for j in jobs] == [(0, "passed"), (0, "passed")]
    assert jobs[0]["artifact"] == jobs[1]["artifact"] and Path(jobs[0]["artifact"]).is_file()
    by_stage: dict[str, list[str]] = {}
    for job in jobs:
        for stage in job["stages"]:
            by_stage.setdefault(stage["name"], []).append(stage["status"])
    assert {name: sorted(s) for name, s in by_stage.items()} == {
        name: ["hit", "ran"] for name in STAGE_NAMES
    }, by_stage
