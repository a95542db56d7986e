"""Share the machine's cores between the jobs of a sweep that run side by side.

torch runs its intra-op work on every core by default; two joblib workers on a 2-core machine
then fight over the same cores and the sweep is slower than running its jobs one after the
other. Each worker of a parallel launcher takes ``cores // n_jobs`` threads instead (at least
one). The setting goes into ``OMP_NUM_THREADS`` (and MKL's; ``base/thread_budget.py``), which
torch reads when it is imported and every ONNX Runtime session of the library reads when it is
made, and into torch directly when it is imported already: a job which never needs torch does not
import it for this.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from hyperexport.base.thread_budget import give_threads

log = logging.getLogger(__name__)


def parallel_jobs(launcher: Mapping[str, Any] | None, cores: int) -> int:
    """How many jobs run side by side on this machine under ``launcher`` (Hydra's
    ``hydra.launcher`` node); 1 for launchers that run one job at a time or elsewhere."""
    n_jobs = (launcher or {}).get("n_jobs")
    if not isinstance(n_jobs, int) or n_jobs == 0:
        return 1
    if n_jobs < 0:  # joblib: -1 is every core, -2 all but one, ...
        n_jobs = max(1, cores + 1 + n_jobs)
    return max(1, min(n_jobs, cores))


def share_cores(n_jobs: int, cores: int | None = None) -> int:
    """Give this process ``cores // n_jobs`` threads (at least one); returns the count.

    Does nothing (returns the core count) for ``n_jobs <= 1``.
    """
    cores = cores or os.cpu_count() or 1
    if n_jobs <= 1:
        return cores
    threads = max(1, cores // n_jobs)
    give_threads(threads)  # torch when imported after this, and ONNX Runtime's sessions
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    log.info(
        "sweep: %d jobs side by side on %d cores: %d torch threads each", n_jobs, cores, threads
    )
    return threads


#: The fewest cores per worker at which jobs side by side beat running them one after the other
#: here: each worker is a new process that imports torch and the model again (seconds of CPU),
#: which two cores do not win back (bench/README.md, "bench_sweep.py").
CORES_PER_WORKER = 2
#: The command-line selection of the joblib launcher, and of its worker count.
JOBLIB = "hydra/launcher=joblib"
N_JOBS = "hydra.launcher.n_jobs"


def default_n_jobs(cores: int, jobs: int | None) -> int:
    """Workers for a joblib sweep whose ``n_jobs`` is not given: one per
    :data:`CORES_PER_WORKER` cores, no more than the sweep has jobs (at least one, which runs
    the jobs one after the other in the launching process)."""
    workers = max(1, cores // CORES_PER_WORKER)
    return max(1, min(workers, jobs)) if jobs else workers


def with_default_n_jobs(args: list[str], jobs: int | None, cores: int | None = None) -> list[str]:
    """``args`` with ``hydra.launcher.n_jobs=<default_n_jobs>`` added when they select the
    joblib launcher without a worker count (joblib's own default, every core, is slower than
    serial on a small machine); an explicit ``n_jobs`` is kept."""
    if JOBLIB not in args or any(a.startswith(f"{N_JOBS}=") for a in args):
        return args
    cores = cores or os.cpu_count() or 1
    n_jobs = default_n_jobs(cores, jobs)
    log.info("sweep: hydra.launcher.n_jobs not given; %d worker(s) for %d cores", n_jobs, cores)
    return [*args, f"{N_JOBS}={n_jobs}"]
