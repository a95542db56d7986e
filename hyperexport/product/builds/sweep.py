"""A sweep's result: one record per job, then one table and ``sweep.json`` for the whole sweep.

Every job of a multirun writes ``<sweep dir>/jobs/<job number>.json`` (atomically) when it ends,
whichever Hydra launcher ran it: in this process (basic launcher), in worker processes (joblib)
or on other machines (submitit, Ray; the sweep dir must then be on shared storage). When the
multirun ends, the launching process reads them all, prints one table and writes
``<sweep dir>/sweep.json``; the multirun's exit code is the worst of its jobs'
(:func:`hyperexport.base.exit_codes.worst`). A job writes a ``running`` record when it starts, so
a job whose worker died shows up as failed, not as missing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hyperexport.base import exit_codes
from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.engine.hashing import atomic_write_json

log = logging.getLogger(__name__)

JOBS = "jobs"
SWEEP_JSON = "sweep.json"
SWEEP_FORMAT = 1
_STAGE_COLUMNS = STAGE_NAMES
# Overrides left out of the table (they are the same for every job, and in sweep.json).
_NOT_SHOWN = re.compile(r"^[+~]?(build\.|hydra[./]|recipe_file=)")


def job_record(
    num: int,
    overrides: Sequence[str],
    exit_code: int,
    report: Mapping[str, Any] | None,
    *,
    error: str | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """The record of one job, from its build report (None when the job was refused).

    Args:
        num: Hydra's job number.
        overrides: The job's overrides.
        exit_code: The job's exit code.
        report: The build's ``report.json`` content, if a build ran.
        error: Why the job was refused or failed, when there is no report.
        seconds: The job's wall time (validation, build and publication).
    """
    stages = [
        {
            "name": s["name"],
            "status": s["status"],
            "key": s.get("key"),
            "reason": s.get("reason"),
            "seconds": s.get("seconds"),
        }
        for s in (report or {}).get("stages", [])
    ]
    check = (report or {}).get("check")
    return {
        "job": num,
        "overrides": list(overrides),
        "exit_code": exit_code,
        "status": "invalid" if exit_code == exit_codes.INVALID else (report or {}).get("status"),
        "artifact": (report or {}).get("artifacts", {}).get("model"),
        "stages": stages,
        "check": None
        if not isinstance(check, Mapping)
        else ("passed" if check.get("ok") else "failed"),
        "error": (report or {}).get("error") or error,
        "seconds": None if seconds is None else round(seconds, 3),
    }


def write_job_record(sweep_dir: Path, record: Mapping[str, Any]) -> Path:
    """Write one job's record into the sweep folder; returns its path."""
    path = sweep_dir / JOBS / f"{int(record['job']):05d}.json"
    atomic_write_json(path, dict(record))
    return path


def started_record(num: int, overrides: Sequence[str]) -> dict[str, Any]:
    """The record a job writes when it starts: failed until the job replaces it."""
    record = job_record(num, overrides, exit_codes.FAILED, None, error="the job did not finish")
    return {**record, "status": "running"}


def collect(sweep_dir: Path) -> dict[str, Any]:
    """Read every job record of a sweep into the content of ``sweep.json``."""
    jobs: dict[int, dict[str, Any]] = {}
    for path in sorted((sweep_dir / JOBS).glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            jobs[int(data["job"])] = data
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable job record %s: %s", path, e)
    ordered = [jobs[n] for n in sorted(jobs)]
    by_stage: dict[str, float] = {}
    for job in ordered:
        for stage in job.get("stages") or []:
            if isinstance(stage.get("seconds"), (int, float)):
                by_stage[stage["name"]] = by_stage.get(stage["name"], 0.0) + stage["seconds"]
    return {
        "format": SWEEP_FORMAT,
        "sweep_dir": str(sweep_dir),
        "exit_code": exit_codes.worst([int(j["exit_code"]) for j in ordered]),
        # Summed over the jobs (jobs side by side overlap: the sum exceeds the wall time).
        "seconds": {
            "jobs": round(sum(j.get("seconds") or 0.0 for j in ordered), 3),
            "stages": {name: round(t, 3) for name, t in by_stage.items()},
        },
        "jobs": ordered,
    }


def render_table(sweep: Mapping[str, Any]) -> list[str]:
    """One line per job: number, exit code, check, stage statuses, overrides and artifact."""
    header = ["job", "exit", "check", *_STAGE_COLUMNS, "overrides", "artifact or error"]
    rows = [header]
    for job in sweep["jobs"]:
        statuses = {s["name"]: s["status"] for s in job["stages"]}
        rows.append(
            [
                str(job["job"]),
                str(job["exit_code"]),
                job["check"] or "-",
                *(statuses.get(name, "-") for name in _STAGE_COLUMNS),
                " ".join(o for o in job["overrides"] if not _NOT_SHOWN.match(o)) or "-",
                job["artifact"] or _one_line(job["error"] or "-"),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows
    ]
    return [line.rstrip() for line in lines]


def finish(sweep_dir: Path) -> dict[str, Any]:
    """Collect the job records, write ``sweep.json`` and return its content."""
    sweep = collect(sweep_dir)
    atomic_write_json(sweep_dir / SWEEP_JSON, sweep)
    return sweep


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
